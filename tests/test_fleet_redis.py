"""A fleet of gateways sharing one Redis (#34): the desired replica count computed from the
arrivals of every gateway, not one's share; a drain asked of one gateway reaching them all
(those started later too), every stream on the drained replica finishing whole; a reload
listing the replica again bringing it back everywhere."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from policies.config import SimulatedSpec
from router.app import RunningGateway
from router.config import config_from_dict
from router.fleet.signals import FleetSignals
from router.reload import apply
from router.upstream.simulated.app import RunningSim, start_simulator
from router.upstream.simulated.engine import SimEngine
from tests.support import (
    MESSAGES,
    RedisServer,
    SdkClients,
    StartGateway,
    assert_idle,
    gateway_config,
    poll_until,
    sim_backend,
    wait_pools,
)


def shared(raw: dict[str, Any], redis_url: str) -> dict[str, Any]:
    """`raw` with Redis coordination; the fleet's looks only when a test asks for one."""
    return {**raw, "coordination": {"mode": "redis", "url": redis_url},
            "fleet": {"refresh_s": 3600}}


def signals(gw: RunningGateway) -> FleetSignals:
    assert gw.gateway.fleet is not None
    return gw.gateway.fleet


async def scaling(http: aiohttp.ClientSession, gw: RunningGateway) -> dict[str, Any]:
    async with http.get(gw.url + "/admin/scaling") as resp:
        assert resp.status == 200
        body: dict[str, Any] = (await resp.json())["backends"]["big"]
        return body


async def replica(http: aiohttp.ClientSession, gw: RunningGateway, name: str,
                  post: bool = False) -> tuple[int, Any]:
    url = f"{gw.url}/admin/replicas/{name}" + ("/drain" if post else "")
    async with (http.post(url) if post else http.get(url)) as resp:
        return resp.status, await resp.json()


async def load(gw: RunningGateway, sdk: SdkClients, n: int) -> None:
    """`n` answers through `gw`, four at a time (the shared pool's slots)."""
    client, room = sdk(gw), asyncio.Semaphore(4)

    async def one() -> None:
        async with room:
            await client.chat.completions.create(model="chat", messages=MESSAGES)

    await asyncio.gather(*(one() for _ in range(n)))


async def test_every_gateway_counts_the_arrivals_of_all(
        sdk: SdkClients, start: StartGateway, http: aiohttp.ClientSession,
        redis_server: RedisServer) -> None:
    raw = gateway_config(sim_backend("m", slots=4, queue_limit=8, sim={"ttft_s": 0.02},
                                     scaling={"floor": 1, "ceiling": 100,
                                              "utilization": 0.05, "cooldown_s": 0}))
    a, b = [await start(shared(raw, redis_server.url)) for _ in range(2)]
    await signals(a).refresh()
    await signals(b).refresh()  # the baselines: nothing let go yet
    await load(a, sdk, 20)  # through one gateway only
    await signals(a).refresh()
    await signals(b).refresh()
    seen_a, seen_b = await scaling(http, a), await scaling(http, b)
    assert seen_a["scope"] == seen_b["scope"] == "fleet"
    assert seen_b["rate"] == seen_a["rate"] > 0  # b let nothing go: a's arrivals, summed
    assert seen_b["mean_hold_s"] == seen_a["mean_hold_s"]
    assert seen_b["desired"] == seen_a["desired"] > 1  # b alone would ask for its floor
    await asyncio.gather(load(a, sdk, 12), load(b, sdk, 12))  # split across both
    await signals(a).refresh()  # a's own rate and b's last (none)
    await signals(b).refresh()  # b's own and a's last: both
    split_a, split_b = await scaling(http, a), await scaling(http, b)
    assert split_b["rate"] > split_a["rate"] > 0  # b: its own arrivals and a's
    assert split_b["desired"] >= split_a["desired"]
    await redis_server.stop()  # away: each gateway's own figures, and said so
    await signals(b).refresh()
    alone = await scaling(http, b)
    assert alone["scope"] == "gateway" and alone["desired"] >= 1
    await assert_idle(a)
    await assert_idle(b)


@pytest.fixture
async def engines() -> AsyncIterator[list[RunningSim]]:
    """Two engine replicas that every gateway of a test reaches at the same URL."""
    spec = SimulatedSpec(max_num_seqs=8, ttft_s=0, tokens_per_s=0, output_tokens=8)
    sims = [await start_simulator(spec, "m") for _ in range(2)]
    try:
        yield sims
    finally:
        for sim in sims:
            await sim.close()


def group(sims: list[RunningSim], redis_url: str) -> dict[str, Any]:
    endpoints = [{"url": sim.url + "/v1", "slots": 2} for sim in sims]
    raw = {"backends": {"big": {"model": "m", "endpoints": endpoints, "pick": "round_robin",
                                "queue_limit": 30, "queue_timeout_s": 60}},
           "routes": {"chat": {"primary": "big", "overflow": "reject"}}}
    return shared(raw, redis_url)


def retired(gw: RunningGateway, name: str) -> bool:
    return gw.gateway.backends["big"].replicas[name].retired


async def test_a_drain_through_one_gateway_drains_the_replica_on_all(
        sdk: SdkClients, start: StartGateway, http: aiohttp.ClientSession,
        redis_server: RedisServer, engines: list[RunningSim]) -> None:
    raw = group(engines, redis_server.url)
    a, b = [await start(raw) for _ in range(2)]
    first, second = engines[0].engine, engines[1].engine
    first.hold(after_tokens=2)  # their streams run, then pause mid-answer
    second.hold(after_tokens=2)

    async def stream(gw: RunningGateway) -> str:
        chunks = await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES,
                                                       stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in chunks
                        if c.choices])

    running = []
    for gw, sim, count in ((a, first, 1), (b, first, 2), (a, second, 1), (b, second, 2)):
        running.append(asyncio.create_task(stream(gw)))  # each gateway's turns: 0, then 1

        def started(e: SimEngine, count: int = count) -> bool:
            return e.active == count

        await sim.wait_until(started)
    for gw in (a, b):  # each gateway holds a stream on each replica
        mine = gw.gateway.backends["big"].pool.shared.mine  # type: ignore[attr-defined]
        assert sorted(lease.replica for lease in mine) == ["big-0", "big-1"]
    status, standing = await replica(http, a, "big-0", post=True)
    assert status == 200 and standing == {"replica": "big-0", "backend": "big",
                                          "draining": True, "holding": 2, "drained": False,
                                          "scope": "fleet"}
    await poll_until(lambda: retired(b, "big-0"))  # the message reached b
    later = [asyncio.create_task(stream(gw)) for gw in (a, b, a, b)]  # for big-1 alone
    await wait_pools(a, lambda pools: pools["big"][1] == 4)
    assert (await replica(http, b, "big-0"))[1]["holding"] == 2  # a's and b's
    first.release()
    await first.wait_until(lambda e: e.active == 0)
    await poll_until_drained(http, b, "big-0")
    c = await start(raw)  # started after the drain: it learns it from Redis
    assert retired(c, "big-0") and not retired(c, "big-1")
    assert (await replica(http, c, "big-0"))[1]["drained"] is True
    second.release()
    answers = await asyncio.gather(*running, *later)
    assert all(len(answer.split()) == 8 for answer in answers)  # every answer whole
    assert first.stats()["requests"] == 2 and first.stats()["aborted"] == 0
    assert second.stats()["requests"] == 6 and second.stats()["aborted"] == 0
    for gw in (a, b, c):
        await assert_idle(gw)


async def poll_until_drained(http: aiohttp.ClientSession, gw: RunningGateway,
                             name: str) -> None:
    """Until GET says drained (the last lease's release reaches Redis after the engine's
    last token), with a deadline."""
    async with asyncio.timeout(10):
        while not (standing := (await replica(http, gw, name))[1])["drained"]:
            assert standing["draining"] and standing["scope"] == "fleet"
    assert standing == {"replica": name, "backend": "big", "draining": True, "holding": 0,
                        "drained": True, "scope": "fleet"}


async def test_a_reload_listing_the_replica_brings_it_back_on_every_gateway(
        start: StartGateway, http: aiohttp.ClientSession, redis_server: RedisServer,
        engines: list[RunningSim]) -> None:
    raw = group(engines, redis_server.url)
    a, b = [await start(raw) for _ in range(2)]
    assert (await replica(http, a, "big-1", post=True))[0] == 200
    await poll_until(lambda: retired(b, "big-1"))
    status, body = await replica(http, b, "big-0", post=True)  # big-1 is out everywhere
    assert status == 409 and body["error"]["code"] == "last_replica"
    redis = aioredis.Redis.from_url(redis_server.url)
    try:
        assert await redis.smembers("{slotgate:big}:drained") == {b"big-1"}
        await apply(a.gateway, config_from_dict(raw))  # a reload of the same config
        assert not retired(a, "big-1")
        await poll_until(lambda: not retired(b, "big-1"))
        assert await redis.smembers("{slotgate:big}:drained") == set()
    finally:
        await redis.aclose()
    assert (await replica(http, b, "big-1"))[1]["draining"] is False
