"""`on_disconnect`: what a backend's slot does when a non-streaming client leaves mid-answer.

`abort` (the default) closes the upstream connection and frees the slot at once; `drain`
keeps the slot and reads the answer to its end, so an engine that finishes abandoned work
anyway is never handed a second request meanwhile. A cut stream is closed upstream either way.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import openai
import orjson
import pytest

from router.app import RunningGateway
from router.common.config_error import ConfigError
from router.common.record import Phase, RequestRecord
from router.config import config_from_dict
from router.upstream.simulated.engine import FaultMode
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    poll_until,
    sim_backend,
    wait_pools,
)


def record(gw: RunningGateway, request_id: str) -> RequestRecord | None:
    return next((r for r in gw.gateway.recent if r.request_id == request_id), None)


def ask(
    sdk: SdkClients, gw: RunningGateway, request_id: str, stream: bool = False
) -> asyncio.Task[Any]:
    return asyncio.create_task(sdk(gw).chat.completions.create(
        model="chat", messages=MESSAGES, stream=stream, max_tokens=50,
        extra_headers={"X-Request-Id": request_id}))


@pytest.mark.parametrize("setting", [None, "abort"])
async def test_abort_frees_the_slot_and_the_engine_at_once(
    sdk: SdkClients, start: StartGateway, setting: str | None
) -> None:
    extra = {} if setting is None else {"on_disconnect": setting}  # abort is the default
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=1, **extra)))
    sim = engine(gw)
    sim.hold(after_tokens=2)
    leaver = ask(sdk, gw, "leaver")
    await sim.wait_until(lambda e: "leaver" in e.records and e.held == 1)
    leaver.cancel()
    await sim.wait_until(lambda e: e.records["leaver"].aborted)
    await assert_idle(gw)  # while the engine would still be generating
    assert gw.gateway.backends["big"].first().upstream.draining == 0
    sim.release()
    answer = await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)
    assert answer.choices[0].finish_reason == "stop"
    rec = record(gw, "leaver")
    assert rec is not None and rec.disconnect is Phase.BEFORE_FIRST_BYTE
    assert rec.completion_tokens is None  # no answer came back to count
    await assert_idle(gw)


async def test_drain_keeps_the_slot_until_the_engine_has_answered(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=1,
                                                on_disconnect="drain")))
    sim, upstream = engine(gw), gw.gateway.backends["big"].first().upstream
    sim.hold(after_tokens=2)
    leaver = ask(sdk, gw, "leaver")
    await sim.wait_until(lambda e: "leaver" in e.records and e.held == 1)
    leaver.cancel()
    await poll_until(lambda: upstream.draining == 1)  # the gateway knows the client left
    with pytest.raises(asyncio.CancelledError):
        await leaver
    assert gw.gateway.backends["big"].pool.active == 1  # the slot stays taken
    assert not sim.records["leaver"].aborted  # and the engine was not told to stop
    nxt = ask(sdk, gw, "next")
    await wait_pools(gw, lambda s: s["big"] == (1, 1))  # the next one waits in the gateway
    assert "next" not in sim.records  # the engine is never handed a second request
    sim.release()
    answer = await nxt
    assert answer.choices[0].message.content
    assert sim.records["leaver"].completed and sim.peak == 1
    await poll_until(lambda: record(gw, "leaver") is not None)
    rec = record(gw, "leaver")
    assert rec is not None and rec.disconnect is Phase.BEFORE_FIRST_BYTE
    # The drained answer's own usage is recorded: the engine did the work.
    assert not rec.tokens_estimated and rec.completion_tokens == 8
    assert upstream.draining == 0
    await assert_idle(gw)


async def test_drain_ends_at_the_backends_timeout(sdk: SdkClients, start: StartGateway) -> None:
    """An engine that never answers holds a drained slot no longer than its timeout."""
    gw = await start(gateway_config(sim_backend("m", slots=1, on_disconnect="drain",
                                                first_byte_timeout_s=0.5)))
    sim = engine(gw)
    sim.inject_fault(FaultMode.HANG)
    leaver = ask(sdk, gw, "leaver")
    await sim.wait_until(lambda e: "leaver" in e.records)
    leaver.cancel()
    await poll_until(lambda: gw.gateway.backends["big"].first().upstream.draining == 1)
    await assert_idle(gw)  # within 5 s: the 0.5 s first-byte timeout ended the drain
    assert gw.gateway.backends["big"].first().upstream.draining == 0
    assert not gw.gateway.health.is_open("big")  # nobody's failure was counted twice


async def test_drain_still_cuts_a_stream(sdk: SdkClients, start: StartGateway) -> None:
    """Engines stop a stream whose connection closes, so `drain` does not wait for one."""
    gw = await start(gateway_config(sim_backend("m", slots=1, on_disconnect="drain")))
    sim = engine(gw)
    sim.hold(after_tokens=3)
    stream = await sdk(gw).chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, extra_headers={"X-Request-Id": "cut"})
    assert (await stream.__anext__()).choices
    await stream.close()
    await sim.wait_until(lambda e: e.records["cut"].aborted)
    await assert_idle(gw)
    assert gw.gateway.backends["big"].first().upstream.draining == 0


async def test_drain_answers_a_client_that_stays(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, on_disconnect="drain")))
    answer = await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)
    assert answer.usage is not None and answer.usage.completion_tokens == 8
    engine(gw).inject_fault(FaultMode.ERROR_500)
    with pytest.raises(openai.InternalServerError):
        await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)
    await assert_idle(gw)


def test_the_setting_is_checked() -> None:
    assert config_from_dict(gateway_config(sim_backend("m", 1))).backends["big"].on_disconnect \
        == "abort"
    with pytest.raises(ConfigError) as caught:
        config_from_dict(gateway_config(sim_backend("m", 1, on_disconnect="wait")))
    assert "backends.big.on_disconnect" in str(caught.value)


async def test_a_stream_whose_client_stops_reading_frees_its_slot(start: StartGateway) -> None:
    """A client that keeps its connection but stops reading (its socket buffers full) is
    cut after the backend's idle timeout: it holds no slot, and the engine aborts."""
    gw = await start(gateway_config(sim_backend(
        "m", slots=1, idle_timeout_s=0.3, sim={"output_tokens": 500_000})))
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    body = orjson.dumps({"model": "chat", "messages": MESSAGES, "stream": True})
    loop = asyncio.get_running_loop()
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once
        client.setblocking(False)
        await loop.sock_connect(client, (host, int(port)))
        await loop.sock_sendall(client, b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                % (len(body), body))
        await poll_until(
            lambda: any(r.disconnect is Phase.STREAMING for r in gw.gateway.recent), 30)
    await assert_idle(gw)
    # The engine learns of the abort when its connection closes, a moment after the slot
    # is free: wait for it rather than look once.
    await engine(gw).wait_until(lambda e: e.active == 0, timeout=30)
