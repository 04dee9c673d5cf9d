"""Backend faults: a circuit breaker per backend, and which failures may be retried.

A failure is the backend's, never the gateway's: refused or timed-out connections, a drop
or a timeout before the first byte, and 5xx answers. Local rejections (429 queue full,
queue timeouts) never count. A failed request is retried on the next backend of its route
only while nothing of the answer has reached the client, and only within a retry budget
(about a fifth of the requests running, at least 3), so a sick backend cannot double the
load on the healthy ones.
"""

from __future__ import annotations

import time

from policies.breaker import BreakerState, CircuitBreaker
from policies.config import BackendConfig
from router.openai_api import ApiError

# Error codes (router.proxy) that mean the backend failed before answering.
BACKEND_FAILURES = frozenset({"upstream_unreachable", "upstream_timeout", "upstream_dropped"})
RETRY_SHARE, RETRY_MIN = 0.2, 3


def backend_failed(err: ApiError) -> bool:
    """Did the backend itself fail (as opposed to refusing a bad request)?"""
    return err.code in BACKEND_FAILURES or (err.code == "upstream_error" and err.status >= 500)


class BackendHealth:
    """One breaker per backend, and the retries in flight."""

    def __init__(self) -> None:
        self.breakers: dict[str, CircuitBreaker] = {}
        self.retrying = 0

    def add(self, name: str, backend: BackendConfig) -> None:
        self.breakers[name] = CircuitBreaker(backend.breaker_failures, backend.breaker_open_s,
                                             time.monotonic)

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
