"""A circuit breaker: after `failures` consecutive failures, calls are refused for `open_s`,
then one probe is let through (half-open); its success closes the circuit. Time is passed in.

Which failures count is decided here too (`Blame`): only the engine's. An engine's error
answer that a request may have caused (a prompt 500 from a live engine) counts only when
the engine's health check fails as well.
"""

from __future__ import annotations

import enum
from collections.abc import Callable


class BreakerState(enum.StrEnum):
    CLOSED = "closed"  # calls go through
    OPEN = "open"  # calls are refused until the probe time
    HALF_OPEN = "half_open"  # one probe is out (one per open_s); its result decides


class Blame(enum.StrEnum):
    """Whose fault an upstream failure is."""

    ENGINE = "engine"  # counts toward the breaker; the request may go to another backend
    REQUEST = "request"  # never counts, never retried elsewhere (it would fail there too)
    UNSURE = "unsure"  # the backend's health check decides: counts only if that fails too


def blame_status(status: int) -> Blame:
    """The blame for an engine's own error answer with HTTP `status`. 502/503/504 say the
    engine (or what fronts it) cannot serve; another 5xx, answered promptly by a live
    engine, may well come from the request (a body it chokes on); a 4xx is the request's."""
    if status in (502, 503, 504):
        return Blame.ENGINE
    return Blame.UNSURE if status >= 500 else Blame.REQUEST


def confirmed_failures(unsure: int, healthy: bool) -> int:
    """Failures a finished health check adds: each unsure failure it was asked to confirm
    when the engine fails the check too; none when the check passes."""
    return 0 if healthy else unsure


class CircuitBreaker:
    def __init__(self, failures: int, open_s: float, clock: Callable[[], float]) -> None:
        self.failures_to_open = failures
        self.open_s = open_s
        self.clock = clock
        self.state = BreakerState.CLOSED
        self.consecutive = 0
        self.opened_at = 0.0
        self.on_change: Callable[[BreakerState], None] | None = None

    def allow(self) -> bool:
        """May a call be made now? Moves an open circuit to half-open when its time is up."""
        if self.state is BreakerState.CLOSED:
            return True
        now = self.clock()
        if now - self.opened_at < self.open_s:
            return False
        # The probe, or another one when the last never reported back (it was cancelled).
        self.opened_at = now
        if self.state is BreakerState.OPEN:
            self._set(BreakerState.HALF_OPEN)
        return True

    def probe_due(self) -> bool:
        """Would `allow` let a probe through now? (A question only: nothing changes.)"""
        return self.state is not BreakerState.CLOSED \
            and self.clock() - self.opened_at >= self.open_s

    def success(self) -> None:
        self.consecutive = 0
        if self.state is not BreakerState.CLOSED:
            self._set(BreakerState.CLOSED)

    def failure(self) -> None:
        self.consecutive += 1
        if self.state is BreakerState.HALF_OPEN or (
            self.state is BreakerState.CLOSED and self.consecutive >= self.failures_to_open
        ):
            self.opened_at = self.clock()
            self._set(BreakerState.OPEN)

    def retry_in_s(self) -> float:
        """Seconds until the next probe may go (0 when calls go through)."""
        if self.state is not BreakerState.OPEN:
            return 0.0
        return max(0.0, self.opened_at + self.open_s - self.clock())

    def _set(self, state: BreakerState) -> None:
        self.state = state
        if self.on_change is not None:
            self.on_change(state)
