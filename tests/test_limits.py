"""The per-key limits' model (`policies.limits.model`), step by step: token buckets, budgets
reserved then settled, and holds that expire."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.limits.model import (
    Book,
    Budget,
    Limit,
    Limits,
    check,
    period_bounds_ms,
    purge,
    renew,
    reserve,
    retry_after_ms,
    seed,
    settle,
)

T0 = int(datetime(2026, 11, 29, 10, 30, tzinfo=UTC).timestamp()) * 1000
FOREVER = math.inf


@pytest.mark.parametrize(("level", "capacity", "retry_ms"), [
    (0.0, 60, 1),  # at 0: above it in the next instant
    (-1.0, 60, 1001),  # 1 per second: back above 0 just after a second
    (-0.5, 60, 501),
    (-100.0, 6000, 1001),
    (-1e-9, 1, 1),
])
def test_retry_is_the_time_until_the_bucket_is_above_zero(
        level: float, capacity: int, retry_ms: int) -> None:
    assert retry_after_ms(level, capacity) == retry_ms


def test_rpm_admits_while_above_zero_then_refills_continuously() -> None:
    book, limits = Book(), Limits(rpm=2)
    assert reserve(book, limits, "a", 1, 0.0, T0, FOREVER) is None
    assert reserve(book, limits, "b", 1, 0.0, T0, FOREVER) is None
    refused = reserve(book, limits, "c", 1, 0.0, T0, FOREVER)
    assert refused is not None and refused.limit is Limit.RPM
    assert refused.retry_ms == 1  # at 0: above it in the next instant (2 per minute)
    assert reserve(book, limits, "c", 1, 0.0, T0 + 1, FOREVER) is None  # took 1/30000
    assert book.rpm is not None and book.rpm.level == pytest.approx(1 / 30000 - 1)
    refused = check(book, limits, T0 + 1)
    assert refused is not None and refused.retry_ms == 30_000
    assert check(book, limits, T0 + 30_001) is None
    assert book.rpm.refilled(2, T0 + 10 * 60_000) == 2  # never above its capacity


def test_tpm_takes_the_estimate_may_go_negative_and_settles_the_difference() -> None:
    book, limits = Book(), Limits(tpm=600)  # 10 tokens a second
    assert reserve(book, limits, "a", 1000, 0.0, T0, FOREVER) is None  # above 0: admitted
    assert book.tpm is not None and book.tpm.level == -400
    refused = check(book, limits, T0)
    assert refused is not None and refused.limit is Limit.TPM
    assert refused.retry_ms == 40_001
    assert settle(book, limits, "a", 1000, 100, 0.0, T0)  # it used 100: 900 come back
    assert book.tpm.level == 500
    assert reserve(book, limits, "b", 10, 0.0, T0, FOREVER) is None
    assert settle(book, limits, "b", 10, 2000, 0.0, T0)  # used more than estimated
    assert book.tpm.level == 500 - 2000
    assert not settle(book, limits, "gone", 100_000, 0, 0.0, T0)  # lost: settled all the same
    assert book.tpm.level == 600  # never above its capacity


def test_a_budget_admits_while_room_remains_then_reserves_the_estimate() -> None:
    budget = Budget("day", tokens=100, cost=None)
    book, limits = Book(), Limits(budgets=(budget,))
    assert reserve(book, limits, "a", 60, 0.0, T0, FOREVER) is None
    assert reserve(book, limits, "b", 60, 0.0, T0, FOREVER) is None  # 60 < 100: room
    refused = reserve(book, limits, "c", 1, 0.0, T0, FOREVER)  # 120 reserved
    assert refused is not None and refused.limit is Limit.BUDGET and refused.budget == budget
    _, midnight = period_bounds_ms("day", T0)
    assert refused.retry_ms == midnight - T0
    assert book.reserved_tokens == 120 and len(book.holds) == 2
    settle(book, limits, "a", 60, 50, 0.0, T0)
    settle(book, limits, "b", 60, 55, 0.0, T0)  # spent 105: over by less than one request
    assert (book.reserved_tokens, book.spends["day"].tokens) == (0, 105)
    assert check(book, limits, T0) is not None
    assert check(book, limits, midnight) is None  # a new day


def test_a_cost_budget_counts_the_reserved_cost() -> None:
    limits = Limits(budgets=(Budget("hour", tokens=None, cost=1.0),))
    book = Book()
    assert reserve(book, limits, "a", 1, 0.75, T0, FOREVER) is None
    assert reserve(book, limits, "b", 1, 0.75, T0, FOREVER) is None  # 0.75 < 1
    assert reserve(book, limits, "c", 1, 0.01, T0, FOREVER) is not None
    settle(book, limits, "a", 1, 1, 0.0, T0)  # cost nothing after all
    assert reserve(book, limits, "c", 1, 0.01, T0, FOREVER) is None


def test_concurrency_counts_live_holds_and_an_expired_hold_gives_all_back() -> None:
    limits = Limits(max_concurrent=2, budgets=(Budget("hour", tokens=1000, cost=None),))
    book = Book()
    assert reserve(book, limits, "a", 400, 0.0, T0, T0 + 15_000) is None
    assert reserve(book, limits, "b", 400, 0.0, T0, T0 + 15_000) is None
    refused = reserve(book, limits, "c", 1, 0.0, T0, FOREVER)
    assert refused is not None and refused.limit is Limit.CONCURRENCY
    assert renew(book, ["a", "x"], T0 + 10_000, T0 + 25_000) == ["x"]  # x: never held
    purge(book, T0 + 15_000)  # b's process died: its expiry passed
    assert set(book.holds) == {"a"} and book.reserved_tokens == 400
    assert reserve(book, limits, "c", 1, 0.0, T0 + 15_000, FOREVER) is None
    assert not settle(book, limits, "b", 400, 0, 0.0, T0 + 16_000)  # lost: charged all
    assert book.spends["hour"].tokens == 0  # the same (it used nothing)


def test_a_refusal_changes_nothing() -> None:
    limits = Limits(max_concurrent=5, rpm=1, tpm=100,
                    budgets=(Budget("month", tokens=10, cost=None),))
    book = Book()
    assert reserve(book, limits, "a", 10, 0.0, T0, FOREVER) is None  # the budget's all
    before = repr(book)
    for at in (T0, T0 + 1):
        assert reserve(book, limits, "b", 5, 0.0, at, FOREVER) is not None
        assert repr(book) == before


def test_seed_only_where_the_period_has_no_spend_yet() -> None:
    book = Book()
    assert seed(book, "day", 500, 1.5, T0)
    assert not seed(book, "day", 700, 2.0, T0 + 1000)  # already seeded (or charged)
    assert (book.spends["day"].tokens, book.spends["day"].cost) == (500, 1.5)
    _, midnight = period_bounds_ms("day", T0)
    assert seed(book, "day", 7, 0.0, midnight)  # a new day: the old spend is no longer it


@pytest.mark.parametrize(("at", "period", "start", "end"), [
    (datetime(2026, 12, 31, 23, 30, tzinfo=UTC), "month",
     datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC)),
    (datetime(2028, 2, 29, 5, tzinfo=UTC), "month",
     datetime(2028, 2, 1, tzinfo=UTC), datetime(2028, 3, 1, tzinfo=UTC)),
    (datetime(2026, 11, 29, 10, 59, 59, tzinfo=UTC), "hour",
     datetime(2026, 11, 29, 10, tzinfo=UTC), datetime(2026, 11, 29, 11, tzinfo=UTC)),
    (datetime(2026, 11, 29, 0, 0, tzinfo=UTC), "day",
     datetime(2026, 11, 29, tzinfo=UTC), datetime(2026, 11, 30, tzinfo=UTC)),
])
def test_periods_are_utc_calendar_periods(at: datetime, period: str, start: datetime,
                                          end: datetime) -> None:
    def ms(d: datetime) -> int:
        return int(d.timestamp()) * 1000

    assert period_bounds_ms(period, ms(at) + 999) == (ms(start), ms(end))


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 50), st.floats(0, 1)), max_size=60))
def test_a_budget_is_overspent_by_at_most_one_estimate(
        steps: list[tuple[bool, int, float]]) -> None:
    """Whatever the order of admissions and ends, with answers within their estimates."""
    limits = Limits(budgets=(Budget("day", tokens=100, cost=None),))
    book, live, made = Book(), list[tuple[str, int]](), 0
    for admit, estimate, used in steps:
        if admit or not live:
            made += 1
            if reserve(book, limits, f"h{made}", estimate, 0.0, T0, FOREVER) is None:
                live.append((f"h{made}", estimate))
        else:
            hold, reserved = live.pop(0)
            settle(book, limits, hold, reserved, int(reserved * used), 0.0, T0)
        spent = book.spends["day"].tokens if "day" in book.spends else 0
        assert spent + sum(e for _, e in live) < 100 + 50
