"""The rate the desired count is computed from (router/fleet/signals.py) is of arrivals:
the slots let go plus the growth of what holds or waits for one. A backlog that grows
while one replica serves what it can counts in full; one that new replicas clear does not
count twice. And a drained replica does not change a listed group's slots per replica."""

from __future__ import annotations

from typing import Any

import aiohttp

from policies.config import Config
from router.config import config_from_dict
from router.fleet.signals import FleetSignals
from tests.support import StartGateway, assert_idle


def scaled(endpoints: int = 1) -> dict[str, Any]:
    sim = {"max_num_seqs": 8, "ttft_s": 0, "tokens_per_s": 0, "output_tokens": 4}
    big: dict[str, Any] = {
        "model": "m", "endpoints": [{"simulated": sim, "slots": 8} for _ in range(endpoints)],
        "queue_limit": 100, "scaling": {"floor": 1, "ceiling": 10, "utilization": 1.0,
                                         "cooldown_s": 0}}
    return {"backends": {"big": big}, "routes": {"chat": {"primary": "big"}}}


class Figures:
    """What the signals read of the backend, set by the test look by look."""

    def __init__(self) -> None:
        self.released, self.active, self.queued = 0.0, 0, 0


def fed(figures: Figures, config: Config) -> FleetSignals:
    return FleetSignals(lambda: config, lambda _: figures.released, lambda _: 1.0,
                        lambda _: figures.queued, lambda _: 1, active=lambda _: figures.active)


def test_the_rate_is_of_arrivals_not_of_departures(monkeypatch: Any) -> None:
    clock = [100.0]
    monkeypatch.setattr("router.fleet.signals.time.monotonic", lambda: clock[0])
    figures = Figures()
    signals = fed(figures, config_from_dict(scaled()))
    figures.active = 8  # one replica's slots, all held
    signals.look()
    # 16 arrive a second; one replica of 8 slots lets 8 go: the other 8 wait
    clock[0], figures.released, figures.active, figures.queued = 101.0, 8, 8, 8
    signals.look()
    assert signals.readings["big"].demand.rate == 16  # not 8
    # new replicas clear the line: 24 let go, the line 8 shorter, 16 still arriving
    clock[0], figures.released, figures.queued = 102.0, 32, 0
    signals.look()
    assert signals.readings["big"].demand.rate == 16  # not 24
    clock[0], figures.released, figures.active = 103.0, 48, 8  # steady at 16/s
    signals.look()
    assert signals.readings["big"].demand.rate == 16
    assert signals.readings["big"].desired == 2  # 16 slots over 8 a replica


async def test_a_drain_leaves_the_slots_per_replica_as_they_are(
        start: StartGateway, http: aiohttp.ClientSession) -> None:
    gw = await start(scaled(endpoints=2))
    fleet = gw.gateway.fleet
    assert fleet is not None
    async with http.post(f"{gw.url}/admin/replicas/big-1/drain") as resp:
        assert resp.status == 200
    fleet.look()
    assert fleet.desired["big"].bounds.slots_per_replica == 8  # not 16 over 1 in service
    await assert_idle(gw)
