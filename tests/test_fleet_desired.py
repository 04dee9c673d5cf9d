"""The desired replica count (policies/fleet/desired.py) as a table of cases, and its
cool-down over time: up at once, down only after a cool-down of wanting less."""

from __future__ import annotations

import pytest

from policies.fleet.desired import Bounds, Demand, DesiredReplicas, replicas_for

THREE = Bounds(slots_per_replica=3, floor=0, ceiling=8, utilization=1.0)


@pytest.mark.parametrize(("demand", "bounds", "replicas"), [
    (Demand(0.0, 4.0, 0, 5.0), THREE, 0),  # nothing at all: the floor (scale to zero)
    (Demand(0.0, 4.0, 0, 5.0), Bounds(3, floor=1, ceiling=8), 1),
    (Demand(0.5, 4.0, 0, 5.0), THREE, 1),  # 2 slots busy on average: one replica
    (Demand(0.75, 4.0, 0, 5.0), THREE, 1),  # 3 slots exactly: still one
    (Demand(0.76, 4.0, 0, 5.0), THREE, 2),  # a little more: two
    (Demand(1.5, 4.0, 0, 5.0), THREE, 2),  # 6 slots
    (Demand(1.5, 4.0, 0, 5.0), Bounds(3, ceiling=8, utilization=0.8), 3),  # 6 / 2.4
    (Demand(0.0, 4.0, 3, 4.0), THREE, 1),  # a line of 3, 4 s each, within 4 s: 3 slots
    (Demand(0.5, 4.0, 6, 4.0), THREE, 3),  # 2 arriving + 6 for the line: 8 slots
    (Demand(0.0, 4.0, 1, 0.0), THREE, 8),  # an objective of 0: as many as allowed
    (Demand(100.0, 4.0, 0, 5.0), THREE, 8),  # the ceiling
    (Demand(-1.0, -4.0, 0, 5.0), THREE, 0),  # nonsense readings read as nothing
])
def test_replicas_for_a_demand(demand: Demand, bounds: Bounds, replicas: int) -> None:
    assert replicas_for(demand, bounds) == replicas


@pytest.mark.parametrize("bounds", [
    dict(slots_per_replica=0), dict(slots_per_replica=1, floor=2, ceiling=1),
    dict(slots_per_replica=1, utilization=0), dict(slots_per_replica=1, cooldown_s=-1),
])
def test_bounds_out_of_range_are_refused(bounds: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="bounds out of range"):
        Bounds(**bounds)  # type: ignore[arg-type]


def test_up_at_once_down_after_the_cool_down() -> None:
    desired = DesiredReplicas(Bounds(3, floor=1, ceiling=8, utilization=1.0, cooldown_s=60))
    busy, idle = Demand(1.5, 4.0, 0, 5.0), Demand(0.0, 4.0, 0, 5.0)
    steps = [(0, idle, 1), (10, busy, 2), (20, idle, 2), (69, idle, 2),  # a lull: kept
             (71, idle, 1),  # 60 s since the last reading that wanted 2
             (80, busy, 2), (90, Demand(0.5, 4.0, 0, 5.0), 2), (141, idle, 1)]
    assert [desired.update(t, d) for t, d, _ in steps] == [n for _, _, n in steps]
