"""A circuit breaker: after `failures` consecutive failures, calls are refused for `open_s`,
then one probe is let through (half-open); its success closes the circuit. Time is passed in.
"""

from __future__ import annotations

import enum
from collections.abc import Callable


class BreakerState(enum.StrEnum):
    CLOSED = "closed"  # calls go through
    OPEN = "open"  # calls are refused until the probe time
    HALF_OPEN = "half_open"  # one probe is out (one per open_s); its result decides


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
