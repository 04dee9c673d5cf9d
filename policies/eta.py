"""Service-time estimates and the Retry-After they imply.

Pure: time is passed in or measured by the caller; no I/O. A later refinement adds
per-position ETAs; today a running mean of slot holding time is enough.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from policies.slots import PoolSnapshot


class HoldTimeEstimator:
    """Exponentially weighted mean of how long a slot is held."""

    __slots__ = ("alpha", "mean_s", "samples")

    def __init__(self, initial_s: float, alpha: float = 0.2) -> None:
        self.mean_s = initial_s
        self.alpha = alpha
        self.samples = 0

    def observe(self, held_s: float) -> None:
        if held_s < 0:
            return
        if self.samples == 0:
            self.mean_s = held_s  # the first real measurement beats the configured guess
        else:
            self.mean_s += self.alpha * (held_s - self.mean_s)
        self.samples += 1


def seconds_until_room(pool: PoolSnapshot) -> float:
    """Expected seconds until `pool` can take one more request (slot or queue place).

    With every slot busy, a slot frees on average every mean_hold / capacity seconds,
    and each release moves the queue up by one.
    """
    if pool.free > 0 or pool.queue_room > 0:
        return 0.0
    return pool.mean_hold_s / pool.capacity


def retry_after_s(pools: Iterable[PoolSnapshot], floor_s: int, cap_s: int) -> int:
    """Whole seconds (>= floor_s >= 1, <= cap_s) until the first of `pools` has room."""
    soonest = min((seconds_until_room(p) for p in pools), default=float(floor_s))
    return max(floor_s, min(cap_s, math.ceil(soonest)))


def queue_wait_s(pool: PoolSnapshot, position: int) -> float:
    """Naive expected wait of the ticket at `position` (1 = next) in a saturated pool."""
    return position * pool.mean_hold_s / pool.capacity
