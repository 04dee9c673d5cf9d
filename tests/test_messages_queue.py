"""/v1/messages while it waits, fails and is left: `ping` events in the queue (named queue
events on request), retries before the first byte, in-band errors after it, and clients
leaving at each phase (the engine sees the abort; no slot stays held)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import anthropic
import pytest

from router.app import RunningGateway
from router.common.record import Phase, RequestRecord
from router.upstream.simulated.engine import FaultMode
from tests.support import (
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    poll_until,
    sim_backend,
    wait_pools,
)
from tests.support.anthropic import ASK, AnthropicClients, read_events

ORDER = ["message_start", "content_block_start", "content_block_delta",
         "content_block_stop", "message_delta", "message_stop"]


def record(gw: RunningGateway, request_id: str) -> RequestRecord | None:
    return next((r for r in gw.gateway.recent if r.request_id == request_id), None)


def ask(claude: AnthropicClients, gw: RunningGateway, request_id: str,
        stream: bool = False) -> asyncio.Task[Any]:
    return asyncio.create_task(claude(gw).messages.create(
        model="chat", max_tokens=50, messages=ASK, stream=stream,
        extra_headers={"X-Request-Id": request_id}))


async def occupy(claude: AnthropicClients, gw: RunningGateway) -> asyncio.Task[Any]:
    """Hold the only slot with a request the engine keeps at its first token."""
    engine(gw).hold()
    holder = ask(claude, gw, "holder")
    await engine(gw).wait_until(lambda e: "holder" in e.records)
    return holder


def squeeze(names: list[str | None]) -> list[str | None]:
    """The event names with repeats of one name in a row folded into one."""
    return [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]


async def test_a_queued_stream_hears_pings_then_completes(
    claude: AnthropicClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=2)))
    holder = await occupy(claude, gw)
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/messages", json={
                "model": "chat", "max_tokens": 50, "messages": ASK, "stream": True}) as resp:
            await wait_pools(gw, lambda s: s["big"] == (1, 1))
            sdk_stream = asyncio.create_task(_final(claude, gw))
            await wait_pools(gw, lambda s: s["big"] == (1, 2))
            engine(gw).release()
            heard = await read_events(resp)
    final = await sdk_stream
    await holder
    names = [name for name, _ in heard]
    assert ":" not in names  # no SSE comments for an Anthropic client
    assert names[0] == "ping" and names.count("ping") >= 2  # its place, then its slot
    assert squeeze([n for n in names if n != "ping"]) == ORDER
    assert all(data == {"type": "ping"} for name, data in heard if name == "ping")
    assert final.content[0].type == "text" and final.stop_reason == "end_turn"
    await assert_idle(gw)


async def _final(claude: AnthropicClients, gw: RunningGateway) -> Any:
    async with claude(gw).messages.stream(model="chat", max_tokens=50, messages=ASK) as s:
        return await s.get_final_message()


async def test_named_queue_events_on_request(claude: AnthropicClients,
                                             start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=1)))
    holder = await occupy(claude, gw)
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/messages", json={
                "model": "chat", "max_tokens": 50, "messages": ASK, "stream": True},
                headers={"X-Slotgate-Queue-Events": "true"}) as resp:
            await wait_pools(gw, lambda s: s["big"] == (1, 1))
            engine(gw).release()
            heard = await read_events(resp)
    await holder
    names = squeeze([name for name, _ in heard])
    assert names == ["queue_status", "start", *ORDER]
    assert heard[0][1]["position"] == 1
    await assert_idle(gw)


@pytest.mark.parametrize("stream", [False, True])
async def test_leaving_while_queued(claude: AnthropicClients, start: StartGateway,
                                    stream: bool) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=1)))
    holder = await occupy(claude, gw)
    leaver = ask(claude, gw, "leaver", stream)
    await wait_pools(gw, lambda s: s["big"] == (1, 1))
    leaver.cancel()
    await wait_pools(gw, lambda s: s["big"] == (1, 0))  # its ticket left the line
    engine(gw).release()
    await holder
    await poll_until(lambda: record(gw, "leaver") is not None)
    rec = record(gw, "leaver")
    assert rec is not None and rec.disconnect is Phase.QUEUED
    assert "leaver" not in engine(gw).records  # the engine never saw it
    await assert_idle(gw)


@pytest.mark.parametrize("stream", [False, True])
async def test_leaving_before_the_first_byte(claude: AnthropicClients, start: StartGateway,
                                             stream: bool) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    sim = engine(gw)
    sim.hold()
    leaver = ask(claude, gw, "leaver", stream)
    await sim.wait_until(lambda e: "leaver" in e.records and e.held == 1)
    leaver.cancel()
    await sim.wait_until(lambda e: e.records["leaver"].aborted)
    await assert_idle(gw)
    await poll_until(lambda: record(gw, "leaver") is not None)
    rec = record(gw, "leaver")
    assert rec is not None and rec.disconnect is Phase.BEFORE_FIRST_BYTE


async def test_leaving_while_streaming(claude: AnthropicClients, start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    sim = engine(gw)
    sim.hold(after_tokens=2)
    async with claude(gw).messages.stream(model="chat", max_tokens=50, messages=ASK,
                                          extra_headers={"X-Request-Id": "cut"}) as s:
        async for text in s.text_stream:
            assert text
            break
    await sim.wait_until(lambda e: e.records["cut"].aborted)
    await assert_idle(gw)
    await poll_until(lambda: record(gw, "cut") is not None)
    rec = record(gw, "cut")
    assert rec is not None and rec.disconnect is Phase.STREAMING


async def test_a_failure_before_the_first_byte_is_retried(claude: AnthropicClients,
                                                          start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1), sim_backend("s", slots=1)))
    engine(gw).inject_fault(FaultMode.REFUSE)
    raw = await claude(gw).messages.with_raw_response.create(
        model="chat", max_tokens=5, messages=ASK)
    assert raw.headers["x-slotgate-backend"] == "small"
    assert (await raw.parse()).content[0].type == "text"
    await assert_idle(gw)


async def test_a_stream_cut_after_its_start_ends_with_an_error_event(
    claude: AnthropicClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    engine(gw).inject_fault(FaultMode.DROP)  # headers and the first token, then gone
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/messages", json={
                "model": "chat", "max_tokens": 50, "messages": ASK, "stream": True}) as resp:
            assert resp.status == 200
            heard = await read_events(resp)
    assert heard[0][0] == "message_start"
    name, data = heard[-1]
    assert name == "error" and data["type"] == "error"
    assert data["error"]["type"] == "api_error"
    with pytest.raises(anthropic.APIStatusError):  # the SDK raises it
        engine(gw).inject_fault(FaultMode.DROP)
        async with claude(gw).messages.stream(model="chat", max_tokens=50,
                                              messages=ASK) as s:
            await s.get_final_message()
    await assert_idle(gw)
