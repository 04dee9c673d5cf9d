"""/v1/responses while it waits, fails and is left: SSE comments while a stream queues
(which the SDK skips), retries before the first byte, an in-band error after it, and
clients leaving at each phase, translated or passed through (the engine sees the abort;
no slot stays held)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from router.app import RunningGateway
from router.common.record import Phase, RequestRecord
from router.upstream.simulated.engine import FaultMode
from tests.support import (
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    poll_until,
    sim_backend,
    wait_pools,
)
from tests.support.anthropic import read_events
from tests.support.responses import ResponsesEngine


def record(gw: RunningGateway, request_id: str) -> RequestRecord | None:
    return next((r for r in gw.gateway.recent if r.request_id == request_id), None)


async def drained(stream: Any) -> list[Any]:
    return [event async for event in await stream]


def ask(sdk: SdkClients, gw: RunningGateway, request_id: str,
        stream: bool = False) -> asyncio.Task[Any]:
    made = sdk(gw).responses.create(model="chat", input="hi", max_output_tokens=50,
                                    stream=stream, extra_headers={"X-Request-Id": request_id})
    return asyncio.create_task(drained(made) if stream else made)


async def occupy(sdk: SdkClients, gw: RunningGateway) -> asyncio.Task[Any]:
    """Hold the only slot with a request the engine keeps at its first token."""
    engine(gw).hold()
    holder = ask(sdk, gw, "holder")
    await engine(gw).wait_until(lambda e: "holder" in e.records)
    return holder


@pytest.fixture
async def native() -> AsyncIterator[ResponsesEngine]:
    served = ResponsesEngine()
    yield served
    served.release()
    await served.close()


async def test_a_queued_stream_hears_comments_then_completes(
        sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=2)))
    holder = await occupy(sdk, gw)
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/responses", json={
                "model": "chat", "input": "hi", "stream": True}) as resp:
            await wait_pools(gw, lambda s: s["big"] == (1, 1))
            by_sdk = ask(sdk, gw, "sdk", stream=True)
            await wait_pools(gw, lambda s: s["big"] == (1, 2))
            engine(gw).release()
            heard = await read_events(resp)
    events = await by_sdk
    await holder
    assert heard[0][0] == ":"  # its place in the queue: an SSE comment
    named = [name for name, _ in heard if name != ":"]
    assert named[0] == "response.created" and named[-1] == "response.completed"
    assert events[-1].type == "response.completed" and events[-1].response.output_text
    await assert_idle(gw)


@pytest.mark.parametrize("stream", [False, True])
async def test_leaving_while_queued(sdk: SdkClients, start: StartGateway,
                                    stream: bool) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=1)))
    holder = await occupy(sdk, gw)
    leaver = ask(sdk, gw, "leaver", stream)
    await wait_pools(gw, lambda s: s["big"] == (1, 1))
    leaver.cancel()
    await wait_pools(gw, lambda s: s["big"] == (1, 0))  # its ticket left the line
    engine(gw).release()
    await holder
    await poll_until(lambda: record(gw, "leaver") is not None)
    rec = record(gw, "leaver")
    assert rec is not None and rec.disconnect is Phase.QUEUED and rec.api == "responses"
    assert "leaver" not in engine(gw).records  # the engine never saw it
    await assert_idle(gw)


@pytest.mark.parametrize("stream", [False, True])
async def test_leaving_before_the_first_byte(sdk: SdkClients, start: StartGateway,
                                             stream: bool) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    sim = engine(gw)
    sim.hold()
    leaver = ask(sdk, gw, "leaver", stream)
    await sim.wait_until(lambda e: "leaver" in e.records and e.held == 1)
    leaver.cancel()
    await sim.wait_until(lambda e: e.records["leaver"].aborted)
    await assert_idle(gw)
    await poll_until(lambda: record(gw, "leaver") is not None)
    rec = record(gw, "leaver")
    assert rec is not None and rec.disconnect is Phase.BEFORE_FIRST_BYTE


async def test_leaving_while_streaming(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    sim = engine(gw)
    sim.hold(after_tokens=2)
    stream = await sdk(gw).responses.create(model="chat", input="hi", stream=True,
                                            extra_headers={"X-Request-Id": "cut"})
    async for event in stream:
        if event.type == "response.output_text.delta":
            break
    await stream.close()
    await sim.wait_until(lambda e: e.records["cut"].aborted)
    await assert_idle(gw)
    await poll_until(lambda: record(gw, "cut") is not None)
    rec = record(gw, "cut")
    assert rec is not None and rec.disconnect is Phase.STREAMING


@pytest.mark.parametrize("stream", [False, True])
async def test_leaving_a_passed_through_request(sdk: SdkClients, start: StartGateway,
                                                native: ResponsesEngine, stream: bool) -> None:
    url = await native.start()
    gw = await start(gateway_config({"url": url, "model": "m", "slots": 1,
                                     "apis": ["chat", "responses"]}))
    native.hold()  # a stream is held after its first event: the client is streaming
    leaver = ask(sdk, gw, "leaver", stream)
    await native.arrived.wait()
    leaver.cancel()
    await native.aborted.wait()  # the engine saw the connection close
    await assert_idle(gw)
    await poll_until(lambda: record(gw, "leaver") is not None)
    rec = record(gw, "leaver")
    assert rec is not None and rec.api == "responses"


async def test_a_failure_before_the_first_byte_is_retried(sdk: SdkClients,
                                                          start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1), sim_backend("s", slots=1)))
    engine(gw).inject_fault(FaultMode.REFUSE)
    raw = await sdk(gw).responses.with_raw_response.create(model="chat", input="hi")
    assert raw.headers["x-slotgate-backend"] == "small"
    assert raw.parse().output_text
    await assert_idle(gw)


async def test_a_stream_cut_after_its_start_ends_with_an_error(sdk: SdkClients,
                                                               start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    engine(gw).inject_fault(FaultMode.DROP)  # headers and the first token, then gone
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/responses", json={
                "model": "chat", "input": "hi", "stream": True}) as resp:
            assert resp.status == 200
            heard = await read_events(resp)
    assert heard[0][0] == "response.created"
    assert heard[-1][1]["error"]["type"] == "api_error"
    engine(gw).inject_fault(FaultMode.DROP)
    with pytest.raises(openai.APIError):  # the SDK raises it
        await drained(sdk(gw).responses.create(model="chat", input="hi", stream=True))
    await assert_idle(gw)


async def test_a_full_queue_is_a_429_with_retry_after(sdk: SdkClients,
                                                      start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=0)))
    holder = await occupy(sdk, gw)
    with pytest.raises(openai.RateLimitError) as refused:
        await sdk(gw).responses.create(model="chat", input="hi")
    assert int(refused.value.response.headers["retry-after"]) >= 1
    body = refused.value.body
    assert isinstance(body, dict) and body["type"] == "rate_limit_error"
    engine(gw).release()
    await holder
    await assert_idle(gw)
