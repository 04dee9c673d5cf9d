"""Ten people, three slots: FIFO hand-off, 429s, overflow, disconnects and queue timeouts."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest

from router.app import RunningGateway
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    send_in_order,
    sim_backend,
    wait_pools,
)


async def test_ten_requests_three_slots_queue_five(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("big-70b", slots=3, queue_limit=5)))
    sim = engine(gw)
    sim.hold()  # every generation waits before its first token until released
    tasks, rejected = await send_in_order(sdk(gw), gw, 10)
    assert gw.gateway.backends["big"].pool.snapshot().active == 3
    assert gw.gateway.backends["big"].pool.queued == 5
    assert len(rejected) == 2
    for err in rejected:
        assert isinstance(err, openai.RateLimitError)
        assert int(err.response.headers["retry-after"]) >= 1
    sim.release()
    texts = await asyncio.gather(*tasks[:8])
    assert all(texts)
    assert sim.peak == 3  # the engine never saw more than its slots
    served = sorted((r for r in gw.gateway.recent if r.slot_at), key=lambda r: r.slot_at or 0)
    assert [r.request_id for r in served] == [f"req-{i}" for i in range(8)]  # FIFO
    assert set(sim.records) == {f"req-{i}" for i in range(8)}
    await assert_idle(gw)


async def test_overflow_sends_the_rest_to_the_fallback(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(
        sim_backend("big-70b", slots=3, queue_limit=5),
        sim_backend("small-8b", slots=8, queue_limit=0),
        overflow="fallback",
    ))
    big, small = engine(gw, "big"), engine(gw, "small")
    big.hold()
    tasks, rejected = await send_in_order(sdk(gw), gw, 10)
    assert rejected == []
    await asyncio.gather(*tasks[8:])  # served by the fallback while the primary is held
    assert set(small.records) == {"req-8", "req-9"}
    big.release()
    await asyncio.gather(*tasks[:8])
    assert set(big.records) == {f"req-{i}" for i in range(8)}
    assert big.peak == 3
    reasons = {r.request_id: (r.backend, r.reason) for r in gw.gateway.recent}
    assert reasons["req-9"] == ("small", "fallback:overflow")
    assert reasons["req-0"] == ("big", "primary")
    await assert_idle(gw)


async def occupy_one_slot(sdk: SdkClients, gw: RunningGateway) -> asyncio.Task[Any]:
    sim = engine(gw)
    sim.hold()
    task = asyncio.create_task(sdk(gw).chat.completions.create(
        model="chat", messages=MESSAGES,
        extra_headers={"X-Request-Id": "holder"}))
    await sim.wait_until(lambda e: "holder" in e.records)
    return task


async def test_stream_that_leaves_while_queued_leaves_the_queue(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=3)))
    holder = await occupy_one_slot(sdk, gw)
    stream = await sdk(gw).chat.completions.create(
        model="chat", messages=MESSAGES, stream=True)
    assert gw.gateway.backends["big"].pool.queued == 1  # 200 and SSE headers came while queued
    await stream.close()
    await wait_pools(gw, lambda s: s["big"] == (1, 0))
    engine(gw).release()
    await holder
    assert set(engine(gw).records) == {"holder"}  # the leaver never reached the engine
    assert gw.gateway.recent[0].disconnect == "queued"
    await assert_idle(gw)


async def test_non_stream_that_leaves_while_queued_leaves_the_queue(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=3)))
    holder = await occupy_one_slot(sdk, gw)
    waiter = asyncio.create_task(sdk(gw).chat.completions.create(
        model="chat", messages=MESSAGES))
    await wait_pools(gw, lambda s: s["big"] == (1, 1))
    waiter.cancel()
    await wait_pools(gw, lambda s: s["big"] == (1, 0))
    engine(gw).release()
    await holder
    await assert_idle(gw)


@pytest.mark.parametrize("stream", [True, False])
async def test_leaving_before_the_first_byte_aborts_the_engine(
    sdk: SdkClients, start: StartGateway, stream: bool
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=1)))
    sim = engine(gw)
    sim.hold()  # the engine accepts the request but produces no token
    task = asyncio.create_task(sdk(gw).chat.completions.create(
        model="chat", messages=MESSAGES, stream=stream,
        extra_headers={"X-Request-Id": "leaver"}))
    await sim.wait_until(lambda e: "leaver" in e.records)
    task.cancel()
    await sim.wait_until(lambda e: e.records["leaver"].aborted)
    assert not sim.records["leaver"].completed
    await assert_idle(gw)
    assert gw.gateway.recent[-1].disconnect == "before_first_byte"


async def test_leaving_mid_stream_aborts_the_engine(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=1)))
    sim = engine(gw)
    sim.hold(after_tokens=3)
    stream = await sdk(gw).chat.completions.create(
        model="chat", messages=MESSAGES, stream=True,
        extra_headers={"X-Request-Id": "reader"})
    got = [await stream.__anext__() for _ in range(2)]
    assert got[0].choices
    await stream.close()
    await sim.wait_until(lambda e: e.records["reader"].aborted)
    assert sim.records["reader"].completion_tokens == 3
    await assert_idle(gw)
    assert gw.gateway.recent[-1].disconnect == "streaming"


async def test_queue_timeout_for_a_stream_is_an_in_band_error(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=1,
                                                queue_timeout_s=0.2)))
    holder = await occupy_one_slot(sdk, gw)
    stream = await sdk(gw).chat.completions.create(
        model="chat", messages=MESSAGES, stream=True)
    with pytest.raises(openai.APIError) as caught:
        async for _ in stream:
            pass
    assert "queue" in caught.value.message.lower()
    assert caught.value.body["code"] == "queue_timeout"  # type: ignore[index]
    engine(gw).release()
    await holder
    await assert_idle(gw)


async def test_queue_timeout_for_a_non_stream_is_503_with_retry_after(
    sdk: SdkClients, start: StartGateway,
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=1,
                                                queue_timeout_s=0.2)))
    holder = await occupy_one_slot(sdk, gw)
    with pytest.raises(openai.InternalServerError) as caught:
        await sdk(gw).chat.completions.create(
            model="chat", messages=MESSAGES)
    assert caught.value.status_code == 503
    assert int(caught.value.response.headers["retry-after"]) >= 1
    assert caught.value.response.headers["x-slotgate-reject-reason"] == "queue_timeout"
    engine(gw).release()
    await holder
    await assert_idle(gw)


async def test_queued_stream_hears_its_position_in_sse_comments(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=3),
                                    server={"queue_heartbeat_s": 0.05}))
    holder = await occupy_one_slot(sdk, gw)
    body = {"model": "chat", "messages": MESSAGES, "stream": True}
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            assert resp.headers["X-Accel-Buffering"] == "no"
            assert resp.headers["x-slotgate-backend"] == "big"
            comments = []
            async for line in resp.content:
                if line.startswith(b": queue "):
                    comments.append(line.strip())
                    if len(comments) == 2:  # the first at once, the next from the heartbeat
                        engine(gw).release()
                if line.startswith(b"data: [DONE]"):
                    break
                if line.startswith(b": slot granted"):
                    assert b"backend=big" in line
    assert [c.split(b" eta_s=")[0] for c in comments[:2]] == [b": queue position=1 ahead=0"] * 2
    await holder
    await assert_idle(gw)


def reporter_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if "QueueReporter._run" in repr(t.get_coro())]


async def test_one_task_tells_every_queued_stream_its_place(
    sdk: SdkClients, start: StartGateway
) -> None:
    """Queue reports come from one task per pool, not one per waiter (thousands may
    queue), and each waiter still hears its own place move up until its slot comes."""
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=8)))
    holder = await occupy_one_slot(sdk, gw)
    body = {"model": "chat", "messages": MESSAGES, "stream": True}
    async with aiohttp.ClientSession() as http:
        streams = []
        for i in range(6):
            resp = await http.post(gw.url + "/v1/chat/completions", json=body)
            streams.append(resp)
            first = await asyncio.wait_for(resp.content.readline(), 5)
            assert first.startswith(b": queue position=%d " % (i + 1)), first
        assert len(reporter_tasks()) == 1
        engine(gw).release()
        for place, resp in enumerate(streams, 1):
            positions, granted = [place], False
            async for line in resp.content:
                if line.startswith(b": queue position="):
                    positions.append(int(line.split(b"=")[1].split()[0]))
                granted = granted or line.startswith(b": slot granted")
                if line.startswith(b"data: [DONE]"):
                    break
            assert granted and positions == sorted(set(positions), reverse=True), positions
            assert place == 1 or len(positions) > 1  # it heard the line move
            resp.release()
    await holder
    await asyncio.wait_for(asyncio.gather(*reporter_tasks()), 5)  # ends with its last listener
    await assert_idle(gw)


async def test_queued_non_stream_reports_its_wait(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=3)))
    holder = await occupy_one_slot(sdk, gw)
    waiter = asyncio.ensure_future(sdk(gw).chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES))
    await wait_pools(gw, lambda s: s["big"] == (1, 1))
    engine(gw).release()
    await holder
    raw = await waiter
    assert raw.headers["x-slotgate-backend"] == "big"
    assert int(raw.headers["x-slotgate-queue-wait-ms"]) >= 0
    record = gw.gateway.recent[-1]
    assert record.phase == "done" and record.queue_wait_ms > 0
    await assert_idle(gw)
