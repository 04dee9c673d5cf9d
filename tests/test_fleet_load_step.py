"""A load step through a real gateway (#34): one replica of 4 slots holding each request
0.5 s (capacity 8 requests/s), open-loop arrivals at fixed intervals. At 0.3x of that
capacity the desired count stays at the floor. Stepped to 2x just after a look, it reaches
the count the step needs, ceil(2 x slots / (slots x utilization)) = 3 at a utilization of
0.8 (docs/autoscaling.md), within two looks: the first sees the step's requests still
holding their slots (a line of four), the second the slots they let go and the line one
replica cannot serve. Given those replicas by a reload, the count settles there once the
line is gone (the rate alone: 16/s x 0.5 s = 8 slots); stepped back down, the cool-down
keeps it for a while, then it falls to the floor. Looks are counted through
`FleetSignals.looked`; the arrivals' pacing is the load itself, not a wait for anything.
The same with the pool shared through Redis: the count from the fleet's figures there."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from router.app import RunningGateway
from router.config import config_from_dict
from router.fleet.signals import FleetSignals, Reading
from router.reload import apply
from tests.support import MESSAGES, RedisServer, StartGateway, assert_idle

SLOTS = 4
HOLD_S = 0.5  # ttft 0.1 s, then 8 more tokens at 20 per second
SIM = {"max_num_seqs": SLOTS, "ttft_s": 0.1, "tokens_per_s": 20, "output_tokens": 9}
CAPACITY = SLOTS / HOLD_S  # requests per second one replica serves
UTILIZATION = 0.8
REFRESH_S = 0.5
COOLDOWN_S = 1.0
# The formula: slots = rate x hold; replicas = ceil(slots / (slots per replica x utilization))
NEEDED = math.ceil(2 * CAPACITY * HOLD_S / (SLOTS * UTILIZATION))


@pytest.fixture(params=["local", "redis"])
def coordination(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The pool kept in this process, or shared through a private redis-server (the
    count then from the fleet's figures in Redis)."""
    if request.param == "local":
        return {}
    server: RedisServer = request.getfixturevalue("redis_server")
    return {"coordination": {"mode": "redis", "url": server.url}}


def config(replicas: int, coordination: dict[str, Any]) -> dict[str, Any]:
    endpoints = [{"name": f"r{i}", "simulated": SIM, "slots": SLOTS} for i in range(replicas)]
    big = {"model": "m", "endpoints": endpoints, "pick": "least_loaded", "queue_limit": 200,
           "initial_hold_s": HOLD_S,
           "scaling": {"floor": 1, "ceiling": 6, "utilization": UTILIZATION,
                       "cooldown_s": COOLDOWN_S}}
    return {"backends": {"big": big},
            "routes": {"chat": {"primary": "big", "overflow": "reject"}},
            "fleet": {"refresh_s": REFRESH_S}, "slo": {"standard": {"ttft_s": 1.0}},
            **coordination}


class OpenLoop:
    """Requests sent at fixed intervals of 1 / rate, whatever the answers do."""

    def __init__(self, http: aiohttp.ClientSession, url: str, rate: float) -> None:
        self.http, self.url, self.rate = http, url, rate
        self.sent: list[asyncio.Task[int]] = []
        self._task = asyncio.create_task(self._run())

    def step(self, rate: float) -> None:
        """From now on, this rate (the next arrival at once)."""
        self.rate = rate
        self._task.cancel()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            self.sent.append(asyncio.create_task(self._one()))
            due += 1 / self.rate
            await asyncio.sleep(max(0.0, due - loop.time()))  # the arrivals' pacing

    async def _one(self) -> int:
        async with self.http.post(self.url + "/v1/chat/completions",
                                  json={"model": "chat", "messages": MESSAGES}) as resp:
            await resp.read()
            return resp.status

    async def stop(self) -> list[int]:
        self._task.cancel()
        return list(await asyncio.gather(*self.sent))


def signals(gw: RunningGateway) -> FleetSignals:
    fleet = gw.gateway.fleet
    assert fleet is not None
    return fleet


async def looks(fleet: FleetSignals, count: int) -> list[Reading]:
    """The backend's readings at the next `count` looks."""
    seen = []
    for _ in range(count):
        async with asyncio.timeout(10 * REFRESH_S):
            await fleet.looked.wait()  # a fresh event after each look
        seen.append(fleet.readings["big"])
    return seen


async def until(fleet: FleetSignals, wanted: Callable[[Reading], bool], within: int
                ) -> list[Reading]:
    """The readings up to the first `wanted` one, at most `within` looks."""
    seen: list[Reading] = []
    while not seen or not wanted(seen[-1]):
        assert len(seen) < within, [(r.desired, round(r.demand.rate, 1),
                                     r.demand.queued) for r in seen]
        seen += await looks(fleet, 1)
    return seen


async def test_a_step_to_twice_the_capacity_asks_for_the_replicas_it_needs(
        start: StartGateway, http: aiohttp.ClientSession,
        coordination: dict[str, Any]) -> None:
    assert NEEDED == 3
    gw = await start(config(1, coordination))
    fleet = signals(gw)
    traffic = OpenLoop(http, gw.url, 0.3 * CAPACITY)
    calm = await looks(fleet, 4)
    assert [r.desired for r in calm] == [1] * 4, calm
    assert all(r.demand.queued == 0 for r in calm)
    traffic.step(2 * CAPACITY)  # just after a look: the next one sees the new rate
    stepped = await until(fleet, lambda r: r.desired >= NEEDED, within=2)
    assert stepped[-1].demand.queued > 0  # one replica cannot serve it: a line forms
    assert stepped[-1].scope == ("fleet" if coordination else "gateway")
    # the autoscaler's answer
    await apply(gw.gateway, config_from_dict(config(NEEDED, coordination)))
    # the line gone, the rate alone asks for the same count: 16/s x 0.5 s = 8 slots
    settled = await until(fleet, lambda r: r.desired == NEEDED and r.demand.queued == 0,
                          within=int(COOLDOWN_S / REFRESH_S) + 8)
    assert settled[-1].replicas == NEEDED
    traffic.step(0.3 * CAPACITY)  # just after a look that asked for the three
    (held,) = await looks(fleet, 1)
    assert held.desired >= NEEDED  # within the cool-down: no replica shed yet
    await until(fleet, lambda r: r.desired == 1, within=int(COOLDOWN_S / REFRESH_S) + 6)
    assert set(await traffic.stop()) == {200}
    await assert_idle(gw)
