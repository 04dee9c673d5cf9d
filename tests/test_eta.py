"""HoldTimeModel and per-position queue ETAs: plain numbers, no clock, no event loop."""

from __future__ import annotations

import heapq
import itertools
import math
import random
import statistics

import pytest

from policies.clock import eta, holds
from policies.clock.eta import (
    forecast_wait,
    predict_wait,
    predict_waits,
)
from policies.clock.holds import HoldTimeModel


def fed(holds: list[float], initial_s: float = 5.0) -> HoldTimeModel:
    model = HoldTimeModel(initial_s)
    for held in holds:
        model.observe(held)
    return model


def mixed_holds(n: int, seed: int = 7) -> list[float]:
    """Seeded short/long mix, like chat turns and long generations."""
    rng = random.Random(seed)
    return [rng.lognormvariate(0.5, 0.5) if rng.random() < 0.7 else rng.lognormvariate(2.4, 0.4)
            for _ in range(n)]


# -- known holding times give known ETAs -------------------------------------------------

@pytest.mark.parametrize(
    ("capacity", "ages", "expected"),  # every hold exactly 10 s; expected wait per position
    [
        (2, [9.0, 1.0], [1.0, 9.0, 11.0, 19.0]),
        (1, [4.0], [6.0, 16.0]),
        (3, [0.0, 0.0, 0.0], [10.0, 10.0, 10.0, 20.0, 20.0, 20.0]),
        (3, [2.0, 5.0, 8.0], [2.0, 5.0, 8.0, 12.0, 15.0, 18.0]),
        (2, [], [0.0, 0.0, 10.0, 10.0]),  # empty active list: free slots first
        (1, [], [0.0, 10.0, 20.0]),
        (3, [3.0], [0.0, 0.0, 7.0, 10.0, 10.0]),  # one running, two free
    ],
)
def test_equal_holds_give_exact_waits(capacity: int, ages: list[float],
                                      expected: list[float]) -> None:
    model = fed([10.0] * 20)
    got = [predict_wait(model, ages, capacity, p) for p in range(1, len(expected) + 1)]
    assert got == pytest.approx(expected, rel=2e-3, abs=1e-6)
    assert predict_waits(model, ages, capacity, len(expected)) == pytest.approx(
        expected, rel=2e-3, abs=1e-6)


def kth_departure_median(holds: list[float], ages: list[float], k: int, draws: int) -> float:
    """Monte Carlo: the median time of the k-th slot to free, holds drawn from `holds`."""
    rng = random.Random(1)
    times = []
    for _ in range(draws):
        ends = [rng.choice([h for h in holds if h > a]) - a for a in ages]
        heapq.heapify(ends)
        t = 0.0
        for _ in range(k):
            t = heapq.heappop(ends)
            heapq.heappush(ends, t + rng.choice(holds))
        times.append(t)
    return statistics.median(times)


@pytest.mark.parametrize("ages", [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.5, 1.5, 3.0]])
def test_prediction_is_the_median_of_a_monte_carlo_of_its_own_distribution(
    ages: list[float],
) -> None:
    """Solving N(t) = k - 1/2 lands on the median k-th departure (lognormal holds)."""
    rng = random.Random(3)
    holds = [rng.lognormvariate(1.3, 0.5) for _ in range(128)]
    model = fed(holds)
    for k in (1, 2, 3, 4, 6, 9, 20):
        simulated = kth_departure_median(holds, ages, k, 3000)
        assert predict_wait(model, ages, 3, k) == pytest.approx(simulated, rel=0.06), k


# -- learning and adaptation -------------------------------------------------------------

@pytest.mark.parametrize(("before", "after"), [(2.0, 10.0), (10.0, 2.0)])
def test_a_change_of_speed_is_learned_within_a_few_holds(before: float, after: float) -> None:
    jitter = [0.95, 1.0, 1.05]
    model = fed([before * jitter[i % 3] for i in range(200)])
    needed = None
    for i in range(1, 40):
        model.observe(after * jitter[i % 3])
        if all(abs(x / after - 1) < 0.1 for x in (
            model.mean_s, model.distribution().mean_s, model.expected_remaining(0.0),
        )):
            needed = i
            break
    assert needed is not None and needed <= holds.SHIFT_RUN
    assert predict_wait(model, [0.0], 1, 2) == pytest.approx(2 * after, rel=0.1)


def test_one_outlier_does_not_reset_the_model() -> None:
    model = fed([2.0, 1.9, 2.1] * 40)
    model.observe(30.0)
    assert model.distribution().mean_s < 2.4
    assert model.expected_remaining(0.0) < 2.4


def test_ewma_keeps_its_original_meaning() -> None:
    est = HoldTimeModel(initial_s=10.0, alpha=0.5)
    for held, mean in [(2.0, 2.0), (4.0, 3.0), (-1.0, 3.0), (math.nan, 3.0), (math.inf, 3.0)]:
        est.observe(held)
        assert est.mean_s == mean
    assert est.samples == 2


def test_max_tokens_buckets_separate_short_from_long() -> None:
    model = HoldTimeModel(5.0)
    for i in range(40):
        model.observe(1.0 + 0.1 * (i % 3), max_tokens=256)
        model.observe(20.0 + 2.0 * (i % 3), max_tokens=4096)
    assert model.expected_remaining(0.0, 256) == pytest.approx(1.1, rel=0.05)
    assert model.expected_remaining(0.0, 4096) == pytest.approx(22.0, rel=0.05)
    assert model.expected_remaining(0.0, 64) == pytest.approx(model.expected_remaining(0.0))
    long_running = predict_wait(model, [0.5], 1, 1, active_max_tokens=[4096])
    short_running = predict_wait(model, [0.5], 1, 1, active_max_tokens=[256])
    assert long_running == pytest.approx(21.5, rel=0.1)
    assert short_running == pytest.approx(0.6, rel=0.2)


# -- remaining time of running leases ----------------------------------------------------

def test_expected_remaining_is_positive_and_the_expected_end_never_moves_earlier() -> None:
    model = fed(mixed_holds(128))
    ages = [0.0, 0.1, 0.5, 1, 2, 3, 5, 8, 13, 20, 30, 50, 100, 1000, 1e5]
    remaining = [model.expected_remaining(a) for a in ages]
    assert all(r > 0 for r in remaining)
    ends = [a + r for a, r in zip(ages, remaining, strict=True)]
    assert all(later >= earlier - 1e-9 for earlier, later in itertools.pairwise(ends))
    assert remaining[0] == pytest.approx(model.distribution().mean_s)
    # Past everything seen, a lease is expected to run on in proportion to its age.
    assert remaining[-1] > remaining[-2] > remaining[-3] > 0


@pytest.mark.parametrize(("age", "expected"), [(0.0, 10.0), (4.0, 6.0), (9.5, 0.5)])
def test_expected_remaining_of_equal_holds(age: float, expected: float) -> None:
    assert fed([10.0] * 20).expected_remaining(age) == pytest.approx(expected)


def test_an_overdue_lease_still_needs_some_time() -> None:
    model = fed([10.0] * 20)
    assert model.expected_remaining(12.0) == pytest.approx(holds.FLOOR_FRACTION * 10.0)
    assert predict_wait(model, [12.0], 1, 1) == pytest.approx(0.5, rel=2e-3)


# -- edge cases --------------------------------------------------------------------------

def test_no_observations_yet_use_the_initial_guess() -> None:
    model = HoldTimeModel(initial_s=6.0)
    assert model.samples == 0
    assert model.mean_s == 6.0
    assert model.distribution().mean_s == pytest.approx(6.0)
    assert model.expected_remaining(0.0) == pytest.approx(6.0)
    waits = predict_waits(model, [0.0, 0.0], 2, 200)
    assert waits[-1] - waits[99] == pytest.approx(100 * 6.0 / 2)  # the rate c / mean
    assert 0 < predict_wait(model, [0.0, 0.0], 2, 1) < 6.0  # sooner of two fresh holds


def test_capacity_one_and_bad_inputs() -> None:
    model = fed([4.0] * 10)
    assert predict_wait(model, [1.0], 1, 1) == pytest.approx(3.0, rel=2e-3)
    assert predict_wait(model, [-1.0], 1, 1) == pytest.approx(4.0, rel=2e-3)  # age < 0: 0
    assert predict_wait(model, [1.0], 1, 0) == 0.0  # position 0: already granted
    with pytest.raises(ValueError, match="capacity"):
        predict_wait(model, [], 0, 1)
    with pytest.raises(ValueError):
        predict_wait(model, [1.0, 2.0], 2, 1, active_max_tokens=[256])
    with pytest.raises(ValueError, match="window"):
        HoldTimeModel(1.0, window=2)


def test_more_leases_than_capacity_after_a_cut() -> None:
    model = fed([10.0] * 20)
    # Capacity cut from 2 to 1: the first departure only brings the pool back to capacity.
    assert predict_wait(model, [9.0, 5.0], 1, 1) == pytest.approx(5.0, rel=2e-3)


def test_waits_grow_with_position() -> None:
    model = fed(mixed_holds(128))
    waits = predict_waits(model, [0.3, 4.0, 11.0], 3, 60)
    assert waits == sorted(waits)
    singles = [predict_wait(model, [0.3, 4.0, 11.0], 3, p) for p in (1, 4, 6, 7, 60)]
    assert singles == pytest.approx([waits[p - 1] for p in (1, 4, 6, 7, 60)], rel=0.01)


# -- cost --------------------------------------------------------------------------------

@pytest.mark.parametrize("capacity", [1, 3, 16, 64])
def test_work_is_bounded_whatever_the_position(capacity: int) -> None:
    model = fed(mixed_holds(128))
    ages = [0.37 * i for i in range(capacity)]
    near = forecast_wait(model, ages, capacity, 2 * capacity + 1)
    far = forecast_wait(model, ages, capacity, 10_000)
    assert far.exact_departures == near.exact_departures <= capacity + min(capacity, 16)
    assert far.terms == near.terms  # beyond the exact part: arithmetic only
    assert far.terms <= 60 * (capacity + 8)
    extra = 10_000 - (2 * capacity + 1)
    assert far.wait_s - near.wait_s == pytest.approx(extra * model.distribution().mean_s
                                                     / capacity)


def test_module_has_no_clock() -> None:
    assert not {"time", "asyncio", "aiohttp"} & set(vars(eta))
