"""Backend faults: a circuit breaker per backend, and which failures may be retried.

Only the engine's failures count against it (`blame`): refused, reset or dropped
connections, connect/first-byte/idle timeouts, and its 502/503/504 answers. A request's
own faults never count and are never retried elsewhere: its 4xx, and a 500 (or another
5xx) answered by a live engine when the backend's health check then passes (the check is
made once per backend at a time, shared by every failure waiting on it). Local rejections
(429 queue full, queue timeouts) never count. A failed request is retried on the next
backend of its route only while nothing of the answer has reached the client, and only
within a retry budget (about a fifth of the requests running, at least 3), so a sick
backend cannot double the load on the healthy ones.

When a breaker opens, the requests queued for that backend leave its line and go to the
route's healthy backends (or get 503). A backend's own 429 is not a failure but
backpressure: the request is retried elsewhere the same way, and the backend takes no new
work until its `Retry-After` has passed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

from policies.config import BackendConfig
from policies.health import failures
from policies.health.breaker import Blame, BreakerState, CircuitBreaker, confirmed_failures
from policies.scheduler.failover import Standing
from router.upstream.failures import UpstreamFailure

MAX_THROTTLE_S = 300.0  # an upstream Retry-After is honoured up to this
log = logging.getLogger("slotgate")

Probe = Callable[[str], Awaitable[bool]]  # backend name -> does it answer a health check?


def blame(failure: UpstreamFailure) -> Blame:
    """Whose fault is `failure`?"""
    return failures.blame(failure.kind, failure.engine_status)


def backend_failed(failure: UpstreamFailure) -> bool:
    """Did the backend itself certainly fail (as opposed to refusing a bad request)?"""
    return blame(failure) is Blame.ENGINE


def retryable(failure: UpstreamFailure) -> bool:
    """May the request go to another backend (nothing was generated for it, and it would
    not fail there the same way)? Not when the engine passed its health check after an
    unsure failure: the request caused it (`BackendHealth.report` made the check)."""
    return failures.retryable(failure.kind, failure.engine_status, failure.healthy)


def parse_retry_after(value: str | None, default_s: float = 1.0) -> float:
    """An upstream Retry-After in seconds (the HTTP-date form is not worth trusting)."""
    try:
        seconds = float(value) if value is not None else default_s
    except ValueError:
        seconds = default_s
    return min(MAX_THROTTLE_S, seconds) if math.isfinite(seconds) and seconds > 0 else default_s


class BackendOpened(Exception):
    """The backend a request was queued for became unavailable while it waited."""


class BackendHealth:
    """One breaker per backend (each also on its `Backend`), and the retries in flight."""

    def __init__(self) -> None:
        self.breakers: dict[str, CircuitBreaker] = {}
        self.retrying = 0
        self.probe: Probe | None = None  # set by the app: an active health check
        self._probers: dict[str, asyncio.Task[None]] = {}
        # backend -> (its confirmation check, the unsure failures that wait on it)
        self._confirming: dict[str, tuple[asyncio.Task[bool], list[int]]] = {}
        self._opened: dict[str, asyncio.Future[None]] = {}  # for waiters in its queue
        self._cool_until: dict[str, float] = {}  # backend -> end of its own Retry-After

    def add(self, name: str, backend: BackendConfig) -> CircuitBreaker:
        """A new breaker for `name` (again after a reload: its count starts anew), watched
        here and returned for its backend to keep."""
        breaker = CircuitBreaker(backend.breaker_failures, backend.breaker_open_s,
                                 time.monotonic)
        breaker.on_change = lambda state: self._changed(name, state)
        self.breakers[name] = breaker
        return breaker

    def _changed(self, name: str, state: BreakerState) -> None:
        if state is BreakerState.OPEN:
            opened = self._opened.pop(name, None)
            if opened is not None and not opened.done():
                opened.set_result(None)  # its queue moves to the route's healthy backends
        if state is BreakerState.OPEN and name not in self._probers:
            log.warning("backend %s is failing: it takes no new work for %g s", name,
                        self.breakers[name].open_s)
            if self.probe is not None:
                self._probers[name] = asyncio.ensure_future(self._check(name))
        elif state is BreakerState.CLOSED:
            log.warning("backend %s answers again", name)

    async def _check(self, name: str) -> None:
        """While the breaker is open, check the backend at each probe time; a healthy
        answer closes the breaker without waiting for a request to risk it."""
        breaker, probe = self.breakers[name], self.probe
        assert probe is not None
        try:
            while breaker.state is not BreakerState.CLOSED:
                await asyncio.sleep(max(breaker.retry_in_s(), 0.05))  # the probe schedule
                if breaker.allow():
                    (breaker.success if await probe(name) else breaker.failure)()
        finally:
            self._probers.pop(name, None)

    async def recovered(self, name: str) -> None:
        """Wait until the health checks of an open backend have put it back."""
        task = self._probers.get(name)
        if task is not None:
            await asyncio.shield(task)

    async def close(self) -> None:
        tasks = [*self._probers.values(), *(t for t, _ in self._confirming.values())]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def opened(self, name: str) -> asyncio.Future[None]:
        """Resolved when `name`'s breaker next opens."""
        future = self._opened.get(name)
        if future is None or future.done():
            future = self._opened[name] = asyncio.get_running_loop().create_future()
        return future

    def throttle(self, name: str, seconds: float) -> None:
        """The backend said 429: no new work for it until `seconds` have passed."""
        until = time.monotonic() + seconds
        if until > self._cool_until.get(name, 0.0):
            self._cool_until[name] = until
            log.warning("backend %s is saturated (429): no new work for %g s", name, seconds)

    def _cooling_s(self, name: str) -> float:
        return max(0.0, self._cool_until.get(name, 0.0) - time.monotonic())

    def standing(self, names: Iterable[str]) -> Mapping[str, Standing]:
        """Each backend's standing now, for `policies.scheduler.failover` (nothing changes: a due
        probe stays due until `take_probe`)."""
        return {name: self._standing(name) for name in names}

    def _standing(self, name: str) -> Standing:
        breaker = self.breakers.get(name)
        cool_until = self._cool_until.get(name)  # (None, but after a 429's Retry-After)
        if cool_until is not None and cool_until > time.monotonic():
            return Standing.DOWN
        if breaker is None or breaker.state is BreakerState.CLOSED:
            return Standing.UP
        return Standing.PROBE if breaker.probe_due() else Standing.DOWN

    def take_probe(self, name: str) -> bool:
        """Make this request the probe of `name`, whose standing was `PROBE`: no other goes
        until the next probe time. False when no probe was due after all."""
        breaker = self.breakers.get(name)
        return breaker is not None and breaker.state is not BreakerState.CLOSED \
            and breaker.allow()

    def is_open(self, name: str) -> bool:
        """Is `name` out of service: its breaker not closed, or waiting out a 429?"""
        return self._standing(name) is not Standing.UP

    def retry_in_s(self, names: list[str]) -> float:
        return min((max(self.breakers[n].retry_in_s() if n in self.breakers else 0.0,
                        self._cooling_s(n)) for n in names), default=1.0)

    def open(self, name: str) -> None:
        """Take `name` out of service now (its group has no replica left): its line moves
        to the route's fallbacks and its health checks bring it back."""
        breaker = self.breakers.get(name)
        while breaker is not None and breaker.state is BreakerState.CLOSED:
            breaker.failure()

    def succeeded(self, name: str) -> None:
        breaker = self.breakers.get(name)
        if breaker is not None:
            breaker.success()

    def failed(self, name: str) -> None:
        breaker = self.breakers.get(name)
        if breaker is not None:
            breaker.failure()

    async def report(self, name: str, failure: UpstreamFailure) -> None:
        """A request on `name` failed: count the engine's faults; for an unsure one, wait
        for the backend's health check, which decides (`failure.healthy`)."""
        verdict = blame(failure)
        if verdict is Blame.ENGINE:
            self.failed(name)
        elif verdict is Blame.UNSURE:
            check = self._confirm(name)
            if check is not None:  # shielded: shared, and it counts whoever stops waiting
                failure.healthy = await asyncio.shield(check)

    def _confirm(self, name: str) -> asyncio.Task[bool] | None:
        """One health check per backend at a time, shared by every unsure failure until it
        ends; none to make (no prober, or an unknown backend): the failure counts."""
        if self.probe is None or name not in self.breakers:
            self.failed(name)
            return None
        entry = self._confirming.get(name)
        if entry is None:
            entry = self._confirming[name] = (
                asyncio.ensure_future(self._confirmation(name, self.probe)), [0])
        entry[1][0] += 1
        return entry[0]

    async def _confirmation(self, name: str, probe: Probe) -> bool:
        try:
            healthy = await probe(name)
        finally:
            _, waiting = self._confirming.pop(name)
        for _ in range(confirmed_failures(waiting[0], healthy)):
            self.failed(name)
        if not healthy:
            log.warning("backend %s failed its health check after an error answer", name)
        return healthy
