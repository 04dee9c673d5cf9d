"""How many replicas a backend wants (#34's scaling signal): from what the gateway knows,
the work arriving and the work waiting, never from the engines' own load figures.

- The work arriving holds `rate x mean hold` slots on average (Little's law), and a pool
  run at `utilization` of its slots leaves headroom for bursts.
- The work waiting must be gone within the objective: `queued x mean hold / objective`
  more slots, so that the last of the line starts in time.

    slots = rate x hold + queued x hold / objective
    replicas = ceil(slots / (slots per replica x utilization)), within [floor, ceiling]

Nothing arriving and nothing waiting wants `floor` replicas (0: scale to zero). A larger
count takes effect at once; a smaller one only once every count computed over the last
`cooldown_s` was at most it, so a lull between bursts does not shed replicas that the next
burst needs. Pure: the caller feeds the readings and the clock.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Demand:
    """What the gateway reads of one backend at one instant."""

    rate: float  # admitted requests per second, recently
    mean_hold_s: float  # the clock's mean slot time of one request
    queued: int  # requests waiting in its line
    objective_s: float  # the time to first token its waiters are held to


@dataclass(frozen=True, slots=True)
class Bounds:
    slots_per_replica: int
    floor: int = 0
    ceiling: int = 1
    utilization: float = 0.8  # of the slots the arriving work may fill on average
    cooldown_s: float = 300.0

    def __post_init__(self) -> None:
        if not (self.slots_per_replica >= 1 and 0 <= self.floor <= self.ceiling
                and 0 < self.utilization <= 1 and self.cooldown_s >= 0):
            raise ValueError(f"bounds out of range: {self}")


def replicas_for(demand: Demand, bounds: Bounds) -> int:
    """The replicas `demand` needs now, within the bounds (no cool-down)."""
    hold = max(0.0, demand.mean_hold_s)
    slots = max(0.0, demand.rate) * hold
    if demand.queued > 0:
        slots += demand.queued * hold / max(demand.objective_s, 1e-3)
    if slots <= 0.0:
        return bounds.floor
    wanted = math.ceil(slots / (bounds.slots_per_replica * bounds.utilization) - 1e-9)
    return min(bounds.ceiling, max(bounds.floor, wanted))


class DesiredReplicas:
    """The signal over time: up at once, down only after `cooldown_s` of wanting less."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self._recent: deque[tuple[float, int]] = deque()  # (time, count computed)
        self.current = bounds.floor

    def update(self, now: float, demand: Demand) -> int:
        """The count to ask for at `now` (monotonic seconds), given this reading."""
        wanted = replicas_for(demand, self.bounds)
        recent = self._recent
        recent.append((now, wanted))
        while recent and recent[0][0] < now - self.bounds.cooldown_s:
            recent.popleft()
        if wanted >= self.current:
            self.current = wanted
        else:  # the most any reading of the cool-down asked for, if below the count
            self.current = min(self.current, max(count for _, count in recent))
        return self.current
