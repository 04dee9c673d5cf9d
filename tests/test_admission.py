"""admission.decide and Retry-After: tables of cases, no I/O."""

from __future__ import annotations

import pytest

from policies.clock.holds import HoldTimeModel
from policies.config import Overflow
from policies.scheduler.admission import Reject, RejectReason, RouteReason, Run, Wait, decide
from policies.slots import PoolSnapshot


def snap(name: str, cap: int, active: int, queued: int, limit: int, hold: float = 6.0
         ) -> PoolSnapshot:
    return PoolSnapshot(name, cap, active, queued, limit, hold)


FREE = snap("big", 3, 1, 0, 5)
QUEUEING = snap("big", 3, 3, 2, 5)
FULL = snap("big", 3, 3, 5, 5)
SMALL_FREE = snap("small", 8, 0, 0, 4)
SMALL_QUEUE = snap("small", 8, 8, 1, 4)
SMALL_FULL = snap("small", 8, 8, 4, 4)
BIG_NEXT_S = FULL.mean_hold_s / FULL.capacity  # next_slot_s of each
SMALL_NEXT_S = SMALL_FULL.mean_hold_s / SMALL_FULL.capacity


@pytest.mark.parametrize(
    ("primary", "fallbacks", "overflow", "expected"),
    [
        (FREE, [], Overflow.REJECT, Run("big", RouteReason.PRIMARY)),
        (QUEUEING, [SMALL_FREE], Overflow.FALLBACK, Wait("big", RouteReason.PRIMARY)),
        (FULL, [SMALL_FREE], Overflow.FALLBACK, Run("small", RouteReason.OVERFLOW)),
        (FULL, [SMALL_QUEUE], Overflow.FALLBACK, Wait("small", RouteReason.OVERFLOW)),
        (FULL, [SMALL_FREE], Overflow.REJECT, Reject(RejectReason.QUEUE_FULL, BIG_NEXT_S)),
        (FULL, [SMALL_FULL], Overflow.FALLBACK, Reject(RejectReason.QUEUE_FULL, SMALL_NEXT_S)),
        (FULL, [], Overflow.FALLBACK, Reject(RejectReason.QUEUE_FULL, BIG_NEXT_S)),
        # A fallback with a free slot beats queueing on an earlier one.
        (FULL, [SMALL_QUEUE, snap("tiny", 1, 0, 0, 0)], Overflow.FALLBACK,
         Run("tiny", RouteReason.OVERFLOW)),
        # A free slot with waiters in front is no free slot (no barging).
        (snap("big", 3, 2, 1, 5), [], Overflow.REJECT, Wait("big", RouteReason.PRIMARY)),
        # A queue of zero: saturated means rejected (or overflowed).
        (snap("big", 1, 1, 0, 0), [SMALL_FREE], Overflow.FALLBACK,
         Run("small", RouteReason.OVERFLOW)),
    ],
)
def test_decide(primary: PoolSnapshot, fallbacks: list[PoolSnapshot], overflow: Overflow,
                expected: object) -> None:
    assert decide(primary, fallbacks, overflow, forecast=next_slot_s) == expected


def next_slot_s(pool: PoolSnapshot) -> float:
    """A stand-in for a pool's own forecast: a slot frees every mean hold / capacity."""
    return pool.mean_hold_s / pool.capacity


def test_a_rejection_advises_the_soonest_forecast_of_the_pools_it_considered() -> None:
    forecasts = {"big": 7.2, "small": 3.1}
    asked: list[str] = []

    def forecast(pool: PoolSnapshot) -> float:
        asked.append(pool.name)
        return forecasts[pool.name]

    assert decide(FULL, [SMALL_FULL], Overflow.FALLBACK, forecast=forecast) == Reject(
        RejectReason.QUEUE_FULL, 3.1)  # the soonest, as forecast (the refusal table clamps)
    assert decide(FULL, [SMALL_FREE], Overflow.REJECT, forecast=forecast) == Reject(
        RejectReason.QUEUE_FULL, 7.2)  # a fallback not overflowed to is not asked
    assert decide(QUEUEING, [], Overflow.REJECT, forecast=forecast) == Wait(
        "big", RouteReason.PRIMARY)
    assert asked == ["big", "small", "big"]  # asked only to refuse


def test_hold_estimator_starts_from_first_measurement_then_smooths() -> None:
    est = HoldTimeModel(initial_s=10.0, alpha=0.5)
    assert est.mean_s == 10.0
    est.observe(2.0)
    assert est.mean_s == 2.0
    est.observe(4.0)
    assert est.mean_s == 3.0
    est.observe(-1.0)  # clock oddities are ignored
    assert est.mean_s == 3.0
