"""Backend faults: a circuit breaker per backend, and which failures may be retried.

A failure is the backend's, never the gateway's: refused or timed-out connections, a drop
or a timeout before the first byte, and 5xx answers. Local rejections (429 queue full,
queue timeouts) never count. A failed request is retried on the next backend of its route
only while nothing of the answer has reached the client, and only within a retry budget
(about a fifth of the requests running, at least 3), so a sick backend cannot double the
load on the healthy ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from policies.breaker import BreakerState, CircuitBreaker
from policies.config import BackendConfig
from router.openai_api import ApiError

# Error codes (router.proxy) that mean the backend failed before answering.
BACKEND_FAILURES = frozenset({"upstream_unreachable", "upstream_timeout", "upstream_dropped"})
RETRY_SHARE, RETRY_MIN = 0.2, 3
log = logging.getLogger("slotgate")

Probe = Callable[[str], Awaitable[bool]]  # backend name -> does it answer a health check?


def backend_failed(err: ApiError) -> bool:
    """Did the backend itself fail (as opposed to refusing a bad request)?"""
    return err.code in BACKEND_FAILURES or (err.code == "upstream_error" and err.status >= 500)


class BackendHealth:
    """One breaker per backend, and the retries in flight."""

    def __init__(self) -> None:
        self.breakers: dict[str, CircuitBreaker] = {}
        self.retrying = 0
        self.probe: Probe | None = None  # set by the app: an active health check
        self._probers: dict[str, asyncio.Task[None]] = {}

    def add(self, name: str, backend: BackendConfig) -> None:
        breaker = CircuitBreaker(backend.breaker_failures, backend.breaker_open_s,
                                 time.monotonic)
        breaker.on_change = lambda state: self._changed(name, state)
        self.breakers[name] = breaker

    def _changed(self, name: str, state: BreakerState) -> None:
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

    def allows(self, name: str) -> bool:
        """May new work go to `name`? (An open breaker lets one probe through per period.)"""
        breaker = self.breakers.get(name)
        return breaker is None or breaker.allow()

    def is_open(self, name: str) -> bool:
        breaker = self.breakers.get(name)
        return breaker is not None and breaker.state is not BreakerState.CLOSED

    def retry_in_s(self, names: list[str]) -> float:
        return min((self.breakers[n].retry_in_s() for n in names if n in self.breakers),
                   default=1.0)

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
