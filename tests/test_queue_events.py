"""What a waiting stream hears: comments by default, named events when it asks."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from router.app import RunningGateway
from router.common.parsed import Endpoint
from router.openai_api import parse_request
from router.upstream.request_body import upstream_body
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    sim_backend,
    wait_pools,
)

EVENTS = {"X-Slotgate-Queue-Events": "true"}


async def read_sse(resp: aiohttp.ClientResponse) -> list[tuple[str | None, bytes]]:
    """(event name, data) of every event, and (":", text) of every comment, in order."""
    out: list[tuple[str | None, bytes]] = []
    name: str | None = None
    async for raw in resp.content:
        line = raw.rstrip(b"\r\n")
        if line.startswith(b":"):
            out.append((":", line[1:].strip()))
        elif line.startswith(b"event:"):
            name = line[6:].strip().decode()
        elif line.startswith(b"data:"):
            out.append((name, line[5:].strip()))
            name = None
    return out


async def occupy(sdk: SdkClients, gw: RunningGateway) -> asyncio.Task[Any]:
    sim = engine(gw)
    sim.hold()
    task = asyncio.create_task(sdk(gw).chat.completions.create(
        model="chat", messages=MESSAGES, extra_headers={"X-Request-Id": "holder"}))
    await sim.wait_until(lambda e: "holder" in e.records)
    return task


async def test_named_events_count_down_then_start_then_chunks(
    sdk: SdkClients, start: StartGateway
) -> None:
    # The engine answers at once but is held; its nominal first-token time (a hint) makes
    # the forecast of each place in line a second or more.
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=5,
                                                rates={"ttft_s": 1.0})))
    holder = await occupy(sdk, gw)
    async with aiohttp.ClientSession() as http:
        streams = []
        for i in range(3):  # three queued streams; the last is third in line
            resp = await http.post(gw.url + "/v1/chat/completions", headers=EVENTS, json={
                "model": "chat", "messages": MESSAGES, "stream": True})
            assert resp.status == 200
            streams.append(resp)

            def queued(s: dict[str, tuple[int, int]], n: int = i + 1) -> bool:
                return s["big"] == (1, n)

            await wait_pools(gw, queued)
        engine(gw).release()
        heard = [await read_sse(resp) for resp in streams]
        for resp in streams:
            resp.release()
    await holder
    last = heard[2]
    positions = [orjson.loads(d)["position"] for n, d in last if n == "queue_status"]
    assert positions[0] == 3 and positions[-1] == 1
    assert positions == sorted(positions, reverse=True)  # never goes back
    status = orjson.loads(next(d for n, d in last if n == "queue_status"))
    assert set(status) == {"position", "ahead", "eta_s", "pool"}
    assert status["ahead"] == 2 and status["pool"] == "big" and status["eta_s"] > 0
    names = [n for n, _ in last]
    begin = names.index("start")
    assert all(n == "queue_status" for n in names[:begin])
    assert all(n is None for n in names[begin + 1:])  # then plain OpenAI chunks
    assert orjson.loads(last[begin][1])["backend"] == "big"
    assert last[-1] == (None, b"[DONE]")
    assert not any(n == ":" for n, _ in last)  # events instead of comments
    await assert_idle(gw)


async def test_default_is_comments_and_the_sdk_ignores_them(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=5)))
    holder = await occupy(sdk, gw)
    async with aiohttp.ClientSession() as http:
        resp = await http.post(gw.url + "/v1/chat/completions", json={
            "model": "chat", "messages": MESSAGES, "stream": True})
        await wait_pools(gw, lambda s: s["big"] == (1, 1))
        stream = await sdk(gw).chat.completions.create(
            model="chat", messages=MESSAGES, stream=True)
        await wait_pools(gw, lambda s: s["big"] == (1, 2))
        engine(gw).release()
        heard = await read_sse(resp)
        resp.release()
        chunks = [c async for c in stream]
    await holder
    assert not any(n not in (None, ":") for n, _ in heard)  # no named events
    assert any(d.startswith(b"queue position=1 ahead=0 eta_s=") for n, d in heard if n == ":")
    assert any(d.startswith(b"slot granted backend=big") for n, d in heard if n == ":")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()  # the SDK saw only normal chunks
    await assert_idle(gw)


async def test_body_field_asks_for_events_and_never_reaches_the_engine(
    start: StartGateway,
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=5)))
    async with aiohttp.ClientSession() as http:  # runs at once: start comes first
        async with http.post(gw.url + "/v1/chat/completions", json={
            "model": "chat", "messages": MESSAGES, "stream": True,
            "slotgate": {"queue_events": True}}) as resp:
            heard = await read_sse(resp)
    assert heard[0][0] == "start"
    assert orjson.loads(heard[0][1])["queue_wait_ms"] == 0
    parsed = parse_request(orjson.dumps({"model": "chat", "messages": MESSAGES,
                                         "slotgate": {"queue_events": True}}), Endpoint.CHAT)
    assert parsed.queue_events
    assert "slotgate" not in orjson.loads(upstream_body(parsed, "m"))
    await assert_idle(gw)
