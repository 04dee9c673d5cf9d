"""Backend faults: a circuit breaker per backend, and which failures may be retried.

A failure is the backend's, never the gateway's: refused or timed-out connections, a drop
or a timeout before the first byte, and 5xx answers. Local rejections (429 queue full,
queue timeouts) never count. A failed request is retried on the next backend of its route
only while nothing of the answer has reached the client, and only within a retry budget
(about a fifth of the requests running, at least 3), so a sick backend cannot double the
load on the healthy ones.

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
from collections.abc import Awaitable, Callable

from policies.breaker import BreakerState, CircuitBreaker
from policies.config import BackendConfig, Overflow, RouteConfig
from router.openai_api import ApiError

# Error codes (router.proxy) that mean the backend failed before answering.
BACKEND_FAILURES = frozenset({"upstream_unreachable", "upstream_timeout", "upstream_dropped"})
RETRY_SHARE, RETRY_MIN = 0.2, 3
MAX_THROTTLE_S = 300.0  # an upstream Retry-After is honoured up to this
log = logging.getLogger("slotgate")

Probe = Callable[[str], Awaitable[bool]]  # backend name -> does it answer a health check?


def backend_failed(err: ApiError) -> bool:
    """Did the backend itself fail (as opposed to refusing a bad request)?"""
    return err.code in BACKEND_FAILURES or (err.code == "upstream_error" and err.status >= 500)


def retryable(err: ApiError) -> bool:
    """May the request go to another backend (nothing was generated for it)?"""
    return backend_failed(err) or err.status == 429


def retry_after_s(value: str | None, default_s: float = 1.0) -> float:
    """An upstream Retry-After in seconds (the HTTP-date form is not worth trusting)."""
    try:
        seconds = float(value) if value is not None else default_s
    except ValueError:
        seconds = default_s
    return min(MAX_THROTTLE_S, seconds) if math.isfinite(seconds) and seconds > 0 else default_s


class BackendOpened(Exception):
    """The backend a request was queued for became unavailable while it waited."""


class BackendHealth:
    """One breaker per backend, and the retries in flight."""

    def __init__(self) -> None:
        self.breakers: dict[str, CircuitBreaker] = {}
        self.retrying = 0
        self.probe: Probe | None = None  # set by the app: an active health check
        self._probers: dict[str, asyncio.Task[None]] = {}
        self._opened: dict[str, asyncio.Future[None]] = {}  # for waiters in its queue
        self._cool_until: dict[str, float] = {}  # backend -> end of its own Retry-After

    def add(self, name: str, backend: BackendConfig) -> None:
        breaker = CircuitBreaker(backend.breaker_failures, backend.breaker_open_s,
                                 time.monotonic)
        breaker.on_change = lambda state: self._changed(name, state)
        self.breakers[name] = breaker

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
        for task in list(self._probers.values()):
            task.cancel()
        await asyncio.gather(*self._probers.values(), return_exceptions=True)

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

    def allows(self, name: str) -> bool:
        """May new work go to `name`? (An open breaker lets one probe through per period.)"""
        if self._cooling_s(name) > 0:
            return False
        breaker = self.breakers.get(name)
        return breaker is None or breaker.allow()

    def is_open(self, name: str) -> bool:
        """Is `name` out of service: its breaker not closed, or waiting out a 429?"""
        breaker = self.breakers.get(name)
        return (breaker is not None and breaker.state is not BreakerState.CLOSED) \
            or self._cooling_s(name) > 0

    def retry_in_s(self, names: list[str]) -> float:
        return min((max(self.breakers[n].retry_in_s() if n in self.breakers else 0.0,
                        self._cooling_s(n)) for n in names), default=1.0)

    def unavailable(self, name: str, chain: list[str], retry_min_s: int) -> ApiError:
        err = ApiError(503, f"Backend '{name}' is unavailable and so are its route's "
                       "fallbacks; retry later.", "server_error", "backend_unavailable")
        err.headers["Retry-After"] = str(max(retry_min_s, math.ceil(self.retry_in_s(chain))))
        return err

    @staticmethod
    def without(route: RouteConfig, name: str) -> RouteConfig | None:
        """`route` minus the backend `name` (None when nothing would be left)."""
        chain = [b for b in (route.primary, *route.fallbacks) if b != name]
        if not chain:
            return None
        return route.model_copy(update={"primary": chain[0], "fallbacks": tuple(chain[1:]),
                                        "overflow": Overflow.FALLBACK})

    def around(self, route: RouteConfig, chain: list[str], retry_min_s: int) -> RouteConfig:
        """`route` without its unavailable primary: its first healthy fallback leads.
        Unchanged when this request is the half-open probe; 503 when nothing is left."""
        if self.allows(route.primary):
            return route
        healthy = [name for name in chain if name != route.primary and not self.is_open(name)]
        if not healthy:
            raise self.unavailable(route.primary, chain, retry_min_s)
        return route.model_copy(update={"primary": healthy[0], "fallbacks": tuple(healthy[1:]),
                                        "overflow": Overflow.FALLBACK})

    def succeeded(self, name: str) -> None:
        breaker = self.breakers.get(name)
        if breaker is not None:
            breaker.success()

    def failed(self, name: str) -> None:
        breaker = self.breakers.get(name)
        if breaker is not None:
            breaker.failure()

    def may_retry(self, running: int) -> bool:
        return self.retrying < max(RETRY_MIN, int(RETRY_SHARE * running))
