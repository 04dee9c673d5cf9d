"""Health per replica of a backend's group: one breaker each.

An engine fault counts against the replica that served it (a request's own faults never
count, as for backends). A connection the replica refuses, or cannot open in time, is
proof enough: its breaker opens at once. An open breaker takes the replica's slots out of
the group's capacity (`SlotPool.set_healthy`), so nothing new goes there and the line
waits for the others; its health check (GET /v1/models) runs at each probe time and puts
it back when it passes. A group with no replica left opens the backend's own breaker, so
its line moves to the route's fallbacks as a failed single engine's does. A replica's own
429 is backpressure, not a fault: it takes no new work until its `Retry-After` has passed
while its siblings serve the group (the last one left cools the backend, as one engine).

A replica found by discovery (router/fleet/discovery.py) joins unready: its health check
runs every `check_s` until it passes, and only then do its slots serve the line. Until one
does, the group is cold, not failing: its breaker stays closed and its line waits
(policies/fleet/warmup.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from policies.config import BackendConfig
from policies.health.breaker import Blame, BreakerState, CircuitBreaker
from policies.health.failures import FailureKind
from policies.slots import SlotPool
from router.upstream.failures import UpstreamFailure
from router.upstream.health import BackendHealth, blame

log = logging.getLogger("slotgate")

ReplicaProbe = Callable[[str, str], Awaitable[bool]]  # (backend, replica) -> answers?
_CONCLUSIVE = frozenset({FailureKind.REFUSED, FailureKind.CONNECT_TIMEOUT})


class ReplicaHealth:
    """The breakers of every grouped backend's replicas (each also on its `Replica`)."""

    def __init__(self, backends: BackendHealth) -> None:
        self.backends = backends
        self.probe: ReplicaProbe | None = None  # set by the app: a replica's health check
        self._breakers: dict[tuple[str, str], CircuitBreaker] = {}
        self._pools: dict[str, SlotPool] = {}
        self._probers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._cooling: dict[tuple[str, str], asyncio.TimerHandle] = {}  # after their 429
        self._readying: dict[tuple[str, str], asyncio.Task[None]] = {}  # first checks

    def add(self, backend: str, replica: str, config: BackendConfig,
            pool: SlotPool, check_s: float | None = None) -> CircuitBreaker:
        """Watch `replica` of `backend` (again after a reload: its count starts anew); its
        breaker is returned for the replica to keep. With `check_s`, it is not ready yet:
        out of service until a health check, made that often, passes."""
        breaker = CircuitBreaker(config.breaker_failures, config.breaker_open_s,
                                 time.monotonic)
        breaker.on_change = lambda state: self._changed(backend, replica, state)
        self._breakers[(backend, replica)] = breaker
        self._pools[backend] = pool
        if check_s is None:
            pool.set_healthy(replica, True)
        elif (backend, replica) not in self._readying and self.probe is not None:
            self._readying[(backend, replica)] = asyncio.ensure_future(
                self._until_ready(backend, replica, self.probe, check_s))
        return breaker

    async def _until_ready(self, backend: str, replica: str, probe: ReplicaProbe,
                           check_s: float) -> None:
        try:
            while True:
                if await probe(backend, replica):
                    break
                await asyncio.sleep(check_s)  # the readiness schedule
            log.info("replica %s of backend %s is ready", replica, backend)
            self._pools[backend].set_healthy(replica, True)
        finally:
            self._readying.pop((backend, replica), None)

    def forget(self, backend: str, replica: str) -> None:
        """`replica` is gone (discovery no longer finds it): no more checks of it."""
        task = self._readying.pop((backend, replica), None)
        if task is not None:
            task.cancel()
        prober = self._probers.pop((backend, replica), None)
        if prober is not None:
            prober.cancel()
        self._breakers.pop((backend, replica), None)

    def report(self, backend: str, replica: str, failure: UpstreamFailure) -> None:
        """A request on `replica` failed: count it if the engine is to blame."""
        breaker = self._breakers.get((backend, replica))
        if breaker is None or blame(failure) is not Blame.ENGINE:
            return
        if failure.kind in _CONCLUSIVE:
            for _ in range(max(1, breaker.failures_to_open - breaker.consecutive)):
                breaker.failure()
        else:
            breaker.failure()

    def throttle(self, backend: str, replica: str, seconds: float) -> bool:
        """`replica` said 429: out of the group's capacity for `seconds`. False when the
        group has no other replica that takes work (then the backend cools, as one)."""
        pool = self._pools.get(backend)
        if pool is None:
            return False
        handle = self._cooling.pop((backend, replica), None)
        if handle is not None:
            handle.cancel()
        pool.set_healthy(replica, False)
        self._cooling[(backend, replica)] = asyncio.get_running_loop().call_later(
            seconds, self._cooled, backend, replica)
        log.warning("replica %s of backend %s is saturated (429): no new work for %g s",
                    replica, backend, seconds)
        return any(seat.healthy for seat in pool.seats())

    def _cooled(self, backend: str, replica: str) -> None:
        self._cooling.pop((backend, replica), None)
        if self.healthy(backend, replica):  # its breaker may have opened meanwhile
            self._pools[backend].set_healthy(replica, True)

    def healthy(self, backend: str, replica: str) -> bool:
        breaker = self._breakers.get((backend, replica))
        return breaker is None or breaker.state is BreakerState.CLOSED

    async def close(self) -> None:
        for handle in self._cooling.values():
            handle.cancel()
        tasks = [*self._probers.values(), *self._readying.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _changed(self, backend: str, replica: str, state: BreakerState) -> None:
        pool = self._pools[backend]
        if state is BreakerState.OPEN:
            pool.set_healthy(replica, False)
            if (backend, replica) not in self._probers:
                log.warning("replica %s of backend %s is failing: it takes no new work",
                            replica, backend)
                if self.probe is not None:
                    self._probers[(backend, replica)] = asyncio.ensure_future(
                        self._check(backend, replica, self.probe))
            if not any(seat.healthy for seat in pool.seats()):
                self.backends.open(backend)  # nothing left: its line moves on
        elif state is BreakerState.CLOSED:
            log.warning("replica %s of backend %s answers again", replica, backend)
            if (backend, replica) not in self._cooling:  # else when its Retry-After ends
                pool.set_healthy(replica, True)
            self.backends.succeeded(backend)

    async def _check(self, backend: str, replica: str, probe: ReplicaProbe) -> None:
        """While the breaker is open, check the replica at each probe time."""
        breaker = self._breakers[(backend, replica)]
        try:
            while breaker.state is not BreakerState.CLOSED:
                await asyncio.sleep(max(breaker.retry_in_s(), 0.05))  # the probe schedule
                if breaker.allow():
                    (breaker.success if await probe(backend, replica) else breaker.failure)()
        finally:
            self._probers.pop((backend, replica), None)
