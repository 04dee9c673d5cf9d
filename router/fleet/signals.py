"""The desired replica count of each backend with `scaling` (#34), computed every
`fleet.refresh_s` from what the gateway holds: the rate of arrivals since the last look
(the requests that let a slot go, plus the growth of those holding or waiting for one:
what came in is what left plus what stayed), the clock's mean hold, the line, and the
`standard` class's time to first token (policies/fleet/desired.py). Counting the slots let
go alone would lag the arrivals by a hold, could not exceed what the replicas in service
serve, and would spike while new replicas clear a backlog. Read by
`slotgate_desired_replicas` and by `GET /admin/scaling`, which KEDA's metrics-api scaler
polls. Nothing on the request path:
a background task reads counters the requests already keep.

With Redis coordination the figures of every gateway sharing it are summed (`shared`,
router/fleet/shared.py): the reading's `scope` is "fleet"; while Redis does not answer,
this gateway's own figures, and "gateway".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from policies.config import Config, Priority
from policies.fleet.desired import Bounds, Demand, DesiredReplicas
from policies.slots.base import CoordinationError
from router.fleet.shared import SharedDemand, summed

log = logging.getLogger("slotgate.fleet")


@dataclass(frozen=True, slots=True)
class Reading:
    """What one backend's count was computed from, at one look."""

    demand: Demand
    desired: int
    replicas: int  # configured now (a group's endpoints)
    at: float  # unix seconds
    scope: str = "gateway"  # "fleet": summed over the gateways sharing Redis


class FleetSignals:
    def __init__(self, config: Callable[[], Config], released: Callable[[str], float],
                 hold_s: Callable[[str], float], queued: Callable[[str], int],
                 replicas: Callable[[str], int], shared: SharedDemand | None = None,
                 active: Callable[[str], int] = lambda _: 0) -> None:
        """`released`: a backend's count of slots let go so far; `hold_s`: its clock's
        mean hold; `queued`: its line now; `replicas`: its endpoints now; `shared`: the
        other gateways' figures (Redis coordination); `active`: its slots held now (with
        Redis, as `queued`, the whole fleet's)."""
        self.config, self.released, self.hold_s = config, released, hold_s
        self.queued, self.replicas, self.shared = queued, replicas, shared
        self.active = active
        self._backlog: dict[str, tuple[float, int]] = {}  # backend -> (monotonic, held+queued)
        self.desired: dict[str, DesiredReplicas] = {}
        self.readings: dict[str, Reading] = {}
        self._seen: dict[str, tuple[float, float]] = {}  # backend -> (monotonic, released)
        self.looked = asyncio.Event()  # set after each look (for whoever waits on one)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.look()  # the counts exist from the start
        self._task = asyncio.create_task(self._loop(), name="fleet-signals")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.config().fleet.refresh_s)
            try:
                await self.refresh()
            except Exception:  # a bug here must not end the counts for good: log it, go on
                log.exception("fleet look failed; the counts are computed again next look")

    def look(self) -> None:
        """Compute every scaled backend's count now, from this gateway's figures."""
        now = time.monotonic()
        for name in self._scaled():
            self._record(name, now, self._grown(name, now, self._own(name, now)), "gateway")
        self._looked()

    def wake(self, name: str) -> None:
        """A cold backend's first waiter (router/fleet/groups.py): its count now, from the
        rate of the last look and the line now (a rate over the instants since that look
        would mean nothing), so a scaled-to-zero backend asks for one at once."""
        last = self.readings.get(name)
        if last is None or name not in self.desired:
            return
        self._record(name, time.monotonic(), replace(last.demand, queued=self.queued(name)),
                     last.scope)
        self._looked()

    async def refresh(self) -> None:
        """A look; with Redis, from the figures of every gateway sharing it (this
        gateway's alone, and said so, while Redis does not answer)."""
        if self.shared is None:
            self.look()
            return
        refresh_s = self.config().fleet.refresh_s
        for name in self._scaled():
            now = time.monotonic()
            demand, scope = self._own(name, now), "gateway"
            try:
                shares = await self.shared.exchange(name, demand, refresh_s)
            except CoordinationError as exc:
                log.debug("fleet figures of %s not shared (%s): this gateway's own", name, exc)
            else:
                demand, scope = summed(demand, shares), "fleet"
            self._record(name, now, self._grown(name, now, demand), scope)
        self._looked()

    def _scaled(self) -> list[str]:
        """Each backend with `scaling`, with its bounds now (its count kept across a
        reload that changed them)."""
        out = []
        for name, backend in self.config().backends.items():
            scaling = backend.scaling
            if scaling is None:
                continue
            # a replica's slots: discovered, `slots` is one's; listed, their sum over the
            # replicas the config lists (a drained one still counts in that sum)
            per = backend.discover.slots if backend.discover is not None \
                else max(1, backend.slots // max(1, len(backend.replicas(name))))
            bounds = Bounds(per, scaling.floor, scaling.ceiling,
                            scaling.utilization, scaling.cooldown_s)
            desired = self.desired.get(name)
            if desired is None or desired.bounds != bounds:
                self.desired[name] = _carried(bounds, desired)
            out.append(name)
        return out

    def _own(self, name: str, now: float) -> Demand:
        """This gateway's demand of one backend: its rate since its last look."""
        released = self.released(name)
        then, before = self._seen.get(name, (now, released))
        self._seen[name] = (now, released)
        rate = (released - before) / (now - then) if now > then else 0.0
        objective = self.config().slo.of(Priority.STANDARD).ttft_s
        return Demand(rate, self.hold_s(name), self.queued(name), objective)

    def _grown(self, name: str, now: float, demand: Demand) -> Demand:
        """`demand` with the growth of the backlog (held and queued) since the last look
        added to its rate: the arrivals, not only the departures. The backlog is the
        pool's, the fleet's with Redis: added once, after the gateways' rates are summed."""
        backlog = self.active(name) + demand.queued
        then, before = self._backlog.get(name, (now, backlog))
        self._backlog[name] = (now, backlog)
        if now <= then:
            return demand
        return replace(demand, rate=max(0.0, demand.rate + (backlog - before) / (now - then)))

    def _record(self, name: str, now: float, demand: Demand, scope: str) -> None:
        desired = self.desired[name].update(now, demand)
        self.readings[name] = Reading(demand, desired, self.replicas(name), time.time(), scope)

    def _looked(self) -> None:
        scaled = {n for n, b in self.config().backends.items() if b.scaling is not None}
        for gone in self.readings.keys() - scaled:  # a reload took its `scaling` away
            del self.readings[gone]
        self.looked.set()
        self.looked = asyncio.Event()

    def as_json(self) -> dict[str, Any]:
        """`GET /admin/scaling`: per backend, the count and what it was computed from."""
        return {"backends": {name: {
            "desired": r.desired, "replicas": r.replicas, "rate": round(r.demand.rate, 4),
            "mean_hold_s": round(r.demand.mean_hold_s, 4), "queued": r.demand.queued,
            "objective_s": r.demand.objective_s, "at": r.at, "scope": r.scope}
            for name, r in
            self.readings.items()}}


def _carried(bounds: Bounds, old: DesiredReplicas | None) -> DesiredReplicas:
    """A backend's count under new bounds (a reload), starting from the count it had."""
    fresh = DesiredReplicas(bounds)
    if old is not None:
        fresh.current = min(bounds.ceiling, max(bounds.floor, old.current))
    return fresh


class FleetCollector(Collector):
    def __init__(self, signals: FleetSignals) -> None:
        self.signals = signals

    def collect(self) -> Iterator[Metric]:
        readings: Mapping[str, Reading] = self.signals.readings
        desired = GaugeMetricFamily(
            "slotgate_desired_replicas", "Replicas each scaled backend wants, from its "
            "arrivals, mean hold, line and objective (docs/autoscaling.md)",
            labels=["backend"])
        replicas = GaugeMetricFamily("slotgate_replicas", "Replicas each scaled backend "
                                     "has in its config now", labels=["backend"])
        for name, reading in readings.items():
            desired.add_metric([name], reading.desired)
            replicas.add_metric([name], reading.replicas)
        yield desired
        yield replicas
