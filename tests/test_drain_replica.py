"""Drain before removal (#34): a replica drained while it streams finishes every answer it
holds (none cut), takes no new work, and says when it holds nothing; the last replica of a
backend in service cannot be drained."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from router.app import RunningGateway
from tests.support import MESSAGES, SdkClients, StartGateway, assert_idle, engine, poll_until

FAST = {"max_num_seqs": 8, "ttft_s": 0, "tokens_per_s": 0, "output_tokens": 8}


def group() -> dict[str, Any]:
    endpoints = [{"simulated": FAST, "slots": 2} for _ in range(2)]
    return {"backends": {"big": {"model": "m", "endpoints": endpoints, "pick": "round_robin",
                                 "queue_limit": 30}},
            "routes": {"chat": {"primary": "big", "overflow": "reject"}}}


async def admin(http: aiohttp.ClientSession, gw: RunningGateway, name: str,
                post: bool = False) -> tuple[int, Any]:
    url = f"{gw.url}/admin/replicas/{name}" + ("/drain" if post else "")
    async with (http.post(url) if post else http.get(url)) as resp:
        return resp.status, await resp.json()


async def test_a_drained_replica_finishes_its_streams_and_takes_no_more(
        sdk: SdkClients, start: StartGateway, http: aiohttp.ClientSession) -> None:
    gw = await start(group())
    client = sdk(gw)
    first, second = engine(gw, "big", "big-0"), engine(gw, "big", "big-1")
    first.hold(after_tokens=2)  # its streams run, then pause mid-answer
    second.hold(after_tokens=2)

    async def stream() -> str:
        chunks = await client.chat.completions.create(model="chat", messages=MESSAGES,
                                                      stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in chunks
                        if c.choices])

    running = [asyncio.create_task(stream()) for _ in range(4)]
    await first.wait_until(lambda e: e.active == 2)
    await second.wait_until(lambda e: e.active == 2)
    status, standing = await admin(http, gw, "big-0", post=True)
    assert status == 200 and standing == {"replica": "big-0", "backend": "big",
                                          "draining": True, "holding": 2, "drained": False,
                                          "scope": "gateway"}
    later = [asyncio.create_task(stream()) for _ in range(3)]  # they wait for big-1 alone
    await poll_until(lambda: gw.gateway.backends["big"].pool.queued == 3)
    first.release()
    await first.wait_until(lambda e: e.active == 0)
    assert (await admin(http, gw, "big-0"))[1] == {
        "replica": "big-0", "backend": "big", "draining": True, "holding": 0, "drained": True,
        "scope": "gateway"}
    second.release()
    answers = await asyncio.gather(*running, *later)
    assert all(len(a.split()) == 8 for a in answers)  # every answer whole: none cut
    assert first.stats()["requests"] == 2 and first.stats()["aborted"] == 0
    assert second.stats()["requests"] == 5
    await assert_idle(gw)


async def test_the_last_replica_in_service_is_not_drained(
        start: StartGateway, http: aiohttp.ClientSession) -> None:
    gw = await start(group())
    assert (await admin(http, gw, "big-1", post=True))[0] == 200
    status, body = await admin(http, gw, "big-0", post=True)
    assert status == 409 and body["error"]["code"] == "last_replica"
    status, body = await admin(http, gw, "nope")
    assert status == 404 and body["error"]["code"] == "replica_not_found"
