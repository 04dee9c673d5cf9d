"""Only the engine's faults count against a backend. One client's bad requests (bodies the
engine answers 500 to while its health check passes, gzip bodies, 4xx) never open the
breaker for everyone, and are never retried onto the route's other backends; an engine
that really fails (refuses connections, or 500s and fails its health check) still opens it.
"""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import aiohttp
import orjson
import pytest

from policies.health.breaker import BreakerState
from router.upstream.simulated.engine import FaultMode
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    sim_backend,
)

CHAT = orjson.dumps({"model": "chat", "messages": MESSAGES})


async def post(http: aiohttp.ClientSession, gw: Any, data: bytes,
               headers: dict[str, str] | None = None) -> int:
    async with http.post(gw.url + "/v1/chat/completions", data=data,
                         headers={"Content-Type": "application/json", **(headers or {})}
                         ) as reply:
        await reply.read()
        return reply.status


class ProbeCount:
    """Counts the backend health checks in flight (the gateway's real probe runs)."""

    def __init__(self, gw: Any) -> None:
        self.health = gw.gateway.health
        self.inner = self.health.probe
        self.running = self.peak = self.calls = 0
        self.health.probe = self

    async def __call__(self, name: str) -> bool:
        self.running += 1
        self.calls += 1
        self.peak = max(self.peak, self.running)
        try:
            result: bool = await self.inner(name)
            return result
        finally:
            self.running -= 1


async def test_a_hundred_bad_requests_leave_the_breaker_closed(
    sdk: SdkClients, start: StartGateway
) -> None:
    big = sim_backend("m", slots=4, queue_limit=16, breaker_failures=5, breaker_open_s=60)
    gw = await start(gateway_config(big, sim_backend("m-small", slots=4)))
    probes = ProbeCount(gw)
    engine(gw).inject_fault(FaultMode.REQUEST_500, count=60)
    statuses: list[int] = []
    async with aiohttp.ClientSession() as http:
        for _ in range(6):  # 60 bodies the engine answers 500 to, ten at a time
            statuses += await asyncio.gather(*(post(http, gw, CHAT) for _ in range(10)))
        for _ in range(20):  # gzip bodies: the attack that used to open the breaker
            statuses.append(await post(http, gw, gzip.compress(CHAT),
                                       {"Content-Encoding": "gzip"}))
        for _ in range(10):  # codings the gateway does not decode
            statuses.append(await post(http, gw, CHAT, {"Content-Encoding": "br"}))
        for _ in range(10):  # bodies that are not JSON once decoded
            statuses.append(await post(http, gw, gzip.compress(b"{not json"),
                                       {"Content-Encoding": "gzip"}))
    assert statuses.count(500) == 60 and statuses.count(200) == 20
    assert statuses.count(415) == 10 and statuses.count(400) == 10
    health = gw.gateway.health
    assert health.breakers["big"].state is BreakerState.CLOSED and not health.is_open("big")
    assert health.breakers["big"].consecutive == 0
    assert not engine(gw, "small").records  # the poisoned requests never walked the route
    assert 1 <= probes.calls < 60 and probes.peak == 1  # shared checks, one at a time
    reply = await sdk(gw).chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES)
    assert reply.headers["x-slotgate-backend"] == "big" and reply.parse().choices
    await assert_idle(gw)


async def test_500s_with_a_failing_health_check_still_open_the_breaker(
    sdk: SdkClients, start: StartGateway
) -> None:
    big = sim_backend("m", slots=2, breaker_failures=3, breaker_open_s=60)
    gw = await start(gateway_config(big, sim_backend("m-small", slots=2)))
    engine(gw).inject_fault(FaultMode.ERROR_500, count=3)  # sick: its checks fail too
    for _ in range(3):  # each fails on big, is confirmed, and is retried on small
        reply = await sdk(gw).chat.completions.with_raw_response.create(
            model="chat", messages=MESSAGES)
        assert reply.headers["x-slotgate-backend"] == "small"
    assert gw.gateway.health.is_open("big")
    await assert_idle(gw)


async def test_refused_connections_open_the_breaker(sdk: SdkClients, start: StartGateway) -> None:
    big = sim_backend("m", slots=2, breaker_failures=3, breaker_open_s=60)
    gw = await start(gateway_config(big, sim_backend("m-small", slots=2)))
    engine(gw).inject_fault(FaultMode.REFUSE, count=3)
    for _ in range(3):
        reply = await sdk(gw).chat.completions.with_raw_response.create(
            model="chat", messages=MESSAGES)
        assert reply.headers["x-slotgate-backend"] == "small"
    assert gw.gateway.health.is_open("big")
    await assert_idle(gw)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_request_caused_500_is_relayed_not_retried(
    start: StartGateway, stream: bool
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1), sim_backend("m-small", slots=1)))
    engine(gw).inject_fault(FaultMode.REQUEST_500)
    async with aiohttp.ClientSession() as http:
        body = orjson.dumps({"model": "chat", "messages": MESSAGES, "stream": stream})
        assert await post(http, gw, body) == 500
    assert not engine(gw, "small").records
    assert not gw.gateway.health.is_open("big")
    await assert_idle(gw)
