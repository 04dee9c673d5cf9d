"""A cold group: a discovered backend with no replica ready (scaled to zero, or its first
replica still starting). Its line keeps admitting; the wait it forecasts is the warm-up
left, then the line as one replica would serve it; it is woken once per cold spell (the
scale-up hook); its waiters give up only after `timeout_s`. Pure: the caller gives the
time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Warmup:
    warmup_s: float  # a replica's expected time from the wake to its first health check
    timeout_s: float  # a cold group's waiters are answered 503 after this long (in place
    # of the backend's queue timeout, which is for a warm line)
    slots: int  # one replica's: the line's forecast once it is up
    woken_at: float | None = None  # this cold spell's wake (None: not woken, or warm)

    def wake(self, now: float) -> bool:
        """The first request of a cold spell: True when this is the wake (fire the hook)."""
        if self.woken_at is not None:
            return False
        self.woken_at = now
        return True

    def warmed(self) -> None:
        """A replica is ready: the next cold spell wakes anew."""
        self.woken_at = None

    def left_s(self, now: float) -> float:
        """The warm-up still expected: all of it before the wake, none once overdue."""
        if self.woken_at is None:
            return self.warmup_s
        return max(0.0, self.woken_at + self.warmup_s - now)



def cold_line(capacity: int, warmup: Warmup | None, now: float) -> tuple[int, float]:
    """A pool's forecast over `capacity` slots; a cold one (none, and a `warmup`): over
    one replica's, after the warm-up left. Returns (slots, seconds added)."""
    if capacity or warmup is None:
        return capacity, 0.0
    return warmup.slots, warmup.left_s(now)
