"""slotgate in front of a real engine: two llama.cpp servers (primary and fallback, one
sequence each) behind an in-process gateway, driven by the official openai SDK.

The model is a base model: its words mean nothing, so these tests look at structure,
token counts, finish reasons, usage, queueing and cancellation, never at the text. A
generation is made long on purpose by forbidding its end-of-text tokens (logit_bias).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from router.app import RunningGateway
from router.common.record import Phase
from tests.engine.conftest import FIGURES, Engines
from tests.engine.gateway import (
    ASK,
    COMPLEX,
    HELLO,
    NO_EOS,
    engine_config,
    free,
    ledger_rows,
    record,
    rid,
)
from tests.support import SdkClients, StartGateway, assert_idle, poll_until, wait_pools

Connect = Callable[[RunningGateway], AsyncOpenAI]


@pytest.fixture
def connect(sdk: SdkClients) -> Connect:
    """The official SDK pointed at a gateway; the `sdk` fixture closes every client."""
    return sdk


@dataclass
class Streamed:
    """What one raw SSE stream brought, line by line, and when its tokens came."""

    lines: list[str] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)

    def comments(self, prefix: str) -> list[str]:
        return [line for line in self.lines if line.startswith(": " + prefix)]


async def stream_raw(client: AsyncOpenAI, request_id: str, max_tokens: int,
                     messages: Any = ASK) -> Streamed:
    """A stream read through the SDK's raw lines, so that SSE comments are seen too."""
    out = Streamed()
    async with client.chat.completions.with_streaming_response.create(
            model="chat", messages=messages, stream=True, max_tokens=max_tokens,
            logit_bias=NO_EOS, extra_headers={"X-Request-Id": rid(request_id)}) as resp:
        async for line in resp.iter_lines():
            if not line:
                continue  # the blank line that ends each event
            out.lines.append(line)
            if line.startswith("data: {") and '"content"' in line:
                out.token_times.append(time.perf_counter())
    return out


async def test_a_request_without_an_id_reaches_the_engine(
    start: StartGateway, idle: Engines, connect: Connect
) -> None:
    """The gateway's own request id, sent upstream, is one the engine accepts (a UUID)."""
    gw = await start(engine_config(idle))
    raw = await connect(gw).chat.completions.with_raw_response.create(
        model="chat", messages=ASK, max_tokens=4, logit_bias=NO_EOS)
    assert raw.parse().choices[0].finish_reason == "length"
    uuid.UUID(raw.headers["x-request-id"])
    await assert_idle(gw)


async def test_a_completion_and_a_stream_with_usage(
    start: StartGateway, idle: Engines, connect: Connect, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    gw = await start(engine_config(idle, ledger=ledger))
    client = connect(gw)
    listed = await client.models.list()
    assert [m.id for m in listed.data] == ["chat"]

    raw = await client.chat.completions.with_raw_response.create(
        model="chat", messages=ASK, max_tokens=16, logit_bias=NO_EOS,
        extra_headers={"X-Request-Id": rid("plain")})
    answer = raw.parse()
    assert raw.headers["x-slotgate-backend"] == "big"
    assert raw.headers["x-slotgate-route-reason"] == "primary"
    assert answer.object == "chat.completion" and len(answer.choices) == 1
    assert answer.choices[0].finish_reason == "length"
    assert isinstance(answer.choices[0].message.content, str)
    assert answer.usage is not None and answer.usage.completion_tokens == 16
    assert answer.usage.prompt_tokens > 0

    began = time.perf_counter()
    stream = await client.chat.completions.create(
        model="chat", messages=ASK, max_tokens=32, logit_bias=NO_EOS, stream=True,
        stream_options={"include_usage": True}, extra_headers={"X-Request-Id": rid("streamed")})
    token_times: list[float] = []
    finish, usage = None, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            if choice.delta.content is not None:
                token_times.append(time.perf_counter())
            finish = choice.finish_reason or finish
    assert finish == "length" and 1 <= len(token_times) <= 32
    await assert_idle(gw)

    rows = await ledger_rows(gw, ledger)
    plain, streamed = rows[rid("plain")], rows[rid("streamed")]
    assert (plain.status, plain.backend, plain.tokens_estimated) == (200, "big", False)
    assert plain.completion_tokens == 16
    assert plain.prompt_tokens == answer.usage.prompt_tokens
    assert streamed.status == 200 and streamed.prompt_tokens > 0
    if usage is not None:  # the engine reported it in the stream
        assert usage.completion_tokens == 32 and not streamed.tokens_estimated
        assert streamed.completion_tokens == 32
    else:  # it did not: the gateway counted the streamed events, and says so
        assert streamed.tokens_estimated
        assert 32 <= streamed.completion_tokens <= 34  # plus the role and finish chunks
    FIGURES["stream usage from the engine"] = (
        "yes" if usage is not None else "no (the gateway counted; tokens_estimated)")
    span = token_times[-1] - token_times[0]
    FIGURES["decode through the gateway"] = (
        f"{(len(token_times) - 1) / span:.1f} tokens/s "
        f"(first token after {(token_times[0] - began) * 1000:.0f} ms)")


async def test_three_at_once_one_runs_two_queue_in_the_gateway(
    start: StartGateway, idle: Engines, connect: Connect
) -> None:
    gw = await start(engine_config(idle))
    pool = gw.gateway.backends["big"].pool
    peak = 0

    def watch(p: Any) -> None:
        nonlocal peak
        peak = max(peak, p.active)

    unwatch = pool.watch(watch)
    client = connect(gw)
    tasks = [asyncio.create_task(stream_raw(client, f"c{i}", max_tokens=24)) for i in range(3)]
    try:
        await wait_pools(gw, lambda s: s["big"] == (1, 2), within_s=60)
        async with aiohttp.ClientSession() as session, session.get(gw.url + "/metrics") as r:
            metrics = await r.text()
        assert 'llm_active_slots_gauge{backend="big"} 1.0' in metrics
        assert 'llm_queue_depth_gauge{backend="big"} 2.0' in metrics
        # (no look at the engine here: a 24-token answer may end before one could ask)
        results = await asyncio.gather(*tasks)
    finally:
        unwatch()
    assert peak == 1
    for result in results:
        assert result.token_times and result.lines[-1] == "data: [DONE]"
    queued = [r for r in results if r.comments("queue position=")]
    assert len(queued) == 2  # the two that waited heard where they stood
    for result in queued:
        [granted] = result.comments("slot granted backend=big")
        assert int(granted.rsplit("queue_wait_ms=", 1)[1]) > 0
    # The engine ran them one after another: no stream's tokens overlap another's.
    spans = sorted((r.token_times[0], r.token_times[-1]) for r in results)
    for (_, end), (begin, _) in itertools.pairwise(spans):
        assert begin > end
    waits = sorted(record(gw, f"c{i}").queue_wait_ms for i in range(3))
    FIGURES["3 concurrent streams of 24 tokens, 1 slot"] = (
        "queue waits " + ", ".join(f"{w / 1000:.2f} s" for w in waits))
    await assert_idle(gw)


async def test_the_two_engines_as_one_group_of_two_endpoints(
    start: StartGateway, idle: Engines, connect: Connect
) -> None:
    raw = engine_config(idle)
    big = raw["backends"]["big"]
    del big["url"], big["slots"]
    big["endpoints"] = [{"url": idle.primary.url + "/v1", "slots": 1, "name": "primary"},
                        {"url": idle.fallback.url + "/v1", "slots": 1, "name": "fallback"}]
    gw = await start(raw)
    pool = gw.gateway.backends["big"].pool
    peaks = {"primary": 0, "fallback": 0}

    def watch(p: Any) -> None:
        for seat in p.seats():
            peaks[seat.name] = max(peaks[seat.name], seat.active)

    unwatch = pool.watch(watch)
    client = connect(gw)
    tasks = [asyncio.create_task(stream_raw(client, f"g{i}", max_tokens=24)) for i in range(4)]
    try:
        await wait_pools(gw, lambda s: s["big"] == (2, 2), within_s=60)  # both run, two wait
        results = await asyncio.gather(*tasks)
    finally:
        unwatch()
    assert peaks == {"primary": 1, "fallback": 1}  # each engine ran one generation at a time
    for result in results:
        assert result.token_times and result.lines[-1] == "data: [DONE]"
    assert {record(gw, f"g{i}").replica for i in range(4)} == {"primary", "fallback"}
    await assert_idle(gw)


async def test_a_simple_request_goes_to_the_fallback_while_the_primary_is_busy(
    start: StartGateway, idle: Engines, connect: Connect
) -> None:
    gw = await start(engine_config(idle, steer=True))
    client = connect(gw)
    busy = await client.chat.completions.create(
        model="chat", messages=COMPLEX, max_tokens=400, logit_bias=NO_EOS, stream=True,
        extra_headers={"X-Request-Id": rid("busy")})
    assert (await busy.__anext__()).choices  # the primary is generating
    raw = await client.chat.completions.with_raw_response.create(
        model="chat", messages=HELLO, max_tokens=8, extra_headers={"X-Request-Id": rid("hello")})
    answer = raw.parse()
    assert raw.headers["x-slotgate-backend"] == "small"
    assert raw.headers["x-slotgate-route-reason"].startswith("fallback:simple:")
    assert answer.usage is not None and 1 <= answer.usage.completion_tokens <= 8
    assert gw.gateway.backends["big"].pool.active == 1  # the primary was busy all along
    await busy.close()
    await assert_idle(gw)
    assert record(gw, "hello").intent in ("greeting", "chitchat")


async def test_a_cut_stream_is_aborted_at_the_engine(
    start: StartGateway, idle: Engines, connect: Connect
) -> None:
    gw = await start(engine_config(idle))
    client = connect(gw)
    stream = await client.chat.completions.create(
        model="chat", messages=ASK, max_tokens=400, logit_bias=NO_EOS, stream=True,
        extra_headers={"X-Request-Id": rid("cut")})
    times = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content is not None:
            times.append(time.perf_counter())
        if len(times) == 6:
            break
    await stream.close()
    per_token_s = (times[-1] - times[0]) / (len(times) - 1)
    remaining_s = (400 - len(times)) * per_token_s  # had the engine gone on
    await assert_idle(gw)
    began = time.perf_counter()
    answer = await client.chat.completions.create(
        model="chat", messages=ASK, max_tokens=8, logit_bias=NO_EOS,
        extra_headers={"X-Request-Id": rid("after")})
    took = time.perf_counter() - began
    assert answer.choices[0].finish_reason == "length"
    # The engine stopped the cut generation: the next answer did not wait for its ~390
    # remaining tokens (a bound of a quarter of them: 20+ times what 8 tokens take).
    assert took < remaining_s / 4, (took, remaining_s)
    cut = record(gw, "cut")
    assert cut.disconnect is Phase.STREAMING and cut.tokens_estimated
    assert cut.completion_tokens is not None and cut.completion_tokens < 200
    FIGURES["stream cut after 6 tokens, next 8-token answer"] = (
        f"{took:.2f} s (the cut one had ~{remaining_s:.0f} s left)")
    await assert_idle(gw)


@pytest.mark.parametrize("setting", ["abort", "drain"])
async def test_an_abandoned_non_stream(
    start: StartGateway, idle: Engines, connect: Connect, setting: str
) -> None:
    """llama-cpp-python finishes a non-streaming request whose client left. `abort` frees
    the slot at once (the engine, still busy, gets the next request: two at once); `drain`
    keeps the slot until the engine's answer ends, and the next request waits in line."""
    gw = await start(engine_config(idle, on_disconnect=setting))
    client = connect(gw)
    upstream, tokens = gw.gateway.backends["big"].first().upstream, 160
    leaver = asyncio.create_task(client.chat.completions.create(
        model="chat", messages=ASK, max_tokens=tokens, logit_bias=NO_EOS,
        extra_headers={"X-Request-Id": rid("leaver")}))
    await wait_pools(gw, lambda s: s["big"] == (1, 0))
    while await free(idle.primary, within_s=0.5):  # until the engine is generating it
        assert not leaver.done()
    leaver.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaver
    if setting == "abort":
        await assert_idle(gw)  # the slot is free at once...
        assert not await free(idle.primary, within_s=0.5)  # ...the engine is not
        answer = await client.chat.completions.create(
            model="chat", messages=ASK, max_tokens=8, extra_headers={"X-Request-Id": rid("next")})
        nxt, left = record(gw, "next"), record(gw, "leaver")
        assert nxt.queue_wait_ms < 100  # no wait in the gateway, but inside the engine:
        assert nxt.slot_ms > left.slot_ms  # it waited for the rest of the abandoned one
        assert left.completion_tokens is None  # nothing of it came back
        FIGURES[f"abandoned {tokens}-token non-stream, abort"] = (
            f"slot held {left.slot_ms / 1000:.2f} s; next admitted at once, then took "
            f"{nxt.slot_ms / 1000:.2f} s inside the still-busy engine")
    else:
        await poll_until(lambda: upstream.draining == 1, within_s=30.0,
                         every_s=0.01)  # the gateway knows the client left
        assert gw.gateway.backends["big"].pool.active == 1  # and keeps the slot
        follower = asyncio.create_task(client.chat.completions.create(
            model="chat", messages=ASK, max_tokens=8, extra_headers={"X-Request-Id": rid("next")}))
        await wait_pools(gw, lambda s: s["big"] == (1, 1))  # the next one waits in line
        answer = await follower
        await poll_until(lambda: upstream.draining == 0, within_s=30.0,
                         every_s=0.01)
        nxt, left = record(gw, "next"), record(gw, "leaver")
        # The abandoned answer was read to its end (the engine's own usage) before the
        # next request was let through, so that one never waited inside the engine.
        assert left.completion_tokens == tokens and not left.tokens_estimated
        assert left.slot_at is not None and nxt.slot_at is not None
        # (its slot came when the drained one's was given back; 50 ms for the two clocks)
        assert nxt.slot_at >= left.slot_at + left.slot_ms / 1000 - 0.05
        assert nxt.queue_wait_ms > 0 and nxt.slot_ms < left.slot_ms
        FIGURES[f"abandoned {tokens}-token non-stream, drain"] = (
            f"slot held {left.slot_ms / 1000:.2f} s; next waited {nxt.queue_wait_ms / 1000:.2f}"
            f" s in the gateway, then took {nxt.slot_ms / 1000:.2f} s")
    assert answer.choices[0].message.content is not None
    assert left.disconnect is Phase.BEFORE_FIRST_BYTE
    await assert_idle(gw)
