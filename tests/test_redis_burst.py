"""A burst on a Redis-coordinated gateway is not a Redis outage: 1,000 concurrent requests
through one process and 2,000 through two, each reserving its key's limits and taking a
shared slot, get no 503 while Redis answers, and `slotgate_redis_up` stays 1.

The answers are short (a fast simulated engine); the burst's concurrency is at admission,
where every request makes its Redis calls at once.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from router.app import RunningGateway
from router.upstream.simulated.app import RunningSim
from tests.support import (
    MESSAGES,
    GatewayProcess,
    RedisServer,
    StartGateway,
    assert_idle,
    gateway_config,
    sim_backend,
)

KEY = "sk-burst"


SERVER = {"max_connections_per_client": 4000}  # the burst comes from one address


def coordination(redis_url: str) -> dict[str, Any]:
    return {"mode": "redis", "url": redis_url, "lease_ttl_s": 15, "recheck_s": 1}


def auth(**limits: Any) -> dict[str, Any]:
    return {"enabled": True, "keys": [
        {"id": "k", "tenant": "t", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
         **limits}]}


async def burst(urls: list[str], n: int) -> collections.Counter[int]:
    """`n` chat requests at once, spread over `urls`; the count of each status."""
    body = {"model": "chat", "messages": MESSAGES, "max_tokens": 4}
    headers = {"Authorization": f"Bearer {KEY}"}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> int:
            url = urls[i % len(urls)] + "/v1/chat/completions"
            async with session.post(url, json=body, headers=headers) as response:
                await response.read()
                return response.status

        async with asyncio.timeout(120):
            return collections.Counter(await asyncio.gather(*(one(i) for i in range(n))))


def redis_up(exposition: str) -> float:
    line = next(x for x in exposition.splitlines() if x.startswith("slotgate_redis_up "))
    return float(line.split()[1])


async def test_a_burst_through_one_process_is_not_an_outage(
        start: StartGateway, redis_server: RedisServer) -> None:
    raw = gateway_config(sim_backend("m", slots=1000, queue_limit=1000, queue_timeout_s=60),
                         server=SERVER)
    raw["coordination"] = coordination(redis_server.url)
    raw["auth"] = auth(max_concurrent=5000, rpm=100_000)
    raw["logging"] = {"access": False}
    gw: RunningGateway = await start(raw)
    statuses = await burst([gw.url], 1000)
    assert statuses == {200: 1000}, statuses
    assert redis_up(gw.gateway.metrics.exposition().decode()) == 1.0
    coordinator = gw.gateway.coordinator
    assert coordinator is not None and coordinator.healthy.is_set()
    await assert_idle(gw)


async def test_a_burst_through_two_processes_is_not_an_outage(
        tmp_path: Path, redis_server: RedisServer, engine_sim: RunningSim) -> None:
    raw = {
        "server": SERVER,
        "backends": {"big": {"url": engine_sim.url + "/v1", "model": "m", "slots": 2000,
                             "queue_limit": 2000, "queue_timeout_s": 60}},
        "routes": {"chat": {"primary": "big", "overflow": "reject"}},
        "coordination": coordination(redis_server.url),
        "auth": auth(max_concurrent=5000, rpm=100_000),
        "logging": {"access": False},
    }
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(raw), encoding="utf-8")
    gateways = [await GatewayProcess.start(config) for _ in range(2)]
    try:
        statuses = await burst([g.url for g in gateways], 2000)
        assert statuses == {200: 2000}, statuses
        async with aiohttp.ClientSession() as session:
            for g in gateways:
                async with session.get(g.url + "/metrics",
                                       headers={"Authorization": f"Bearer {KEY}"}) as r:
                    assert redis_up(await r.text()) == 1.0
    finally:
        for g in gateways:
            await g.stop()
    assert not any(b"unreachable" in line for g in gateways for line in g.lines)
