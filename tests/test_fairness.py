"""The virtual token counter's rules (policies/limits/fairness.py) as tables: who is picked, the
grant order, the lift of a tenant lining up, the trim of the table."""

from __future__ import annotations

import pytest

from policies.clock.lengths import OUTPUT_PRIOR
from policies.limits.fairness import (
    Counters,
    Waiter,
    expected_tokens,
    order,
    pick,
)


@pytest.mark.parametrize(("heads", "served", "expected"), [
    ([], {}, None),
    ([("a", 0)], {}, "a"),
    ([("a", 0), ("b", 1)], {"a": 10.0, "b": 5.0}, "b"),  # the least counter
    ([("a", 3), ("b", 1)], {"a": 5.0, "b": 5.0}, "b"),  # a tie: the earliest arrival
    ([("a", 0), ("b", 1)], {"b": 1.0}, "a"),  # unknown: 0
    ([("a", 2), ("b", 1), ("c", 0)], {"a": 1.0, "b": 2.0, "c": 3.0}, "a"),
])
def test_pick(heads: list[tuple[str, int]], served: dict[str, float],
              expected: str | None) -> None:
    assert pick(heads, served) == expected


def w(tenant: str, tokens: int = 100, weight: float = 1.0) -> Waiter:
    return Waiter(tenant, weight, tokens)


@pytest.mark.parametrize(("waiters", "served", "expected"), [
    ([], {}, []),
    # equal counters: alternate, first come first; FIFO within a tenant
    ([w("h"), w("h"), w("h"), w("l"), w("l")], {}, [0, 3, 1, 4, 2]),
    # a heavy tenant ahead by far: the light one's waiters all go first
    ([w("h"), w("h"), w("l"), w("l")], {"h": 1000.0}, [2, 3, 0, 1]),
    # weight 2: twice the tokens for the same counter
    ([w("a", weight=2), w("a", weight=2), w("a", weight=2), w("a", weight=2),
      w("b"), w("b")], {}, [0, 4, 1, 2, 5, 3]),
    # bigger answers count more: one of 300 tokens weighs three of 100
    ([w("big", 300), w("big", 300), w("s"), w("s"), w("s"), w("s")], {},
     [0, 2, 3, 4, 1, 5]),
])
def test_order(waiters: list[Waiter], served: dict[str, float], expected: list[int]) -> None:
    assert order(waiters, served) == expected
    if waiters:  # the head of the order is the pick
        heads: dict[str, int] = {}
        for i, waiter in enumerate(waiters):
            heads.setdefault(waiter.tenant, i)
        assert expected[0] == heads[pick(heads.items(), served) or ""]


def test_order_limit_is_a_prefix() -> None:
    waiters = [w("h")] * 5 + [w("l")] * 2
    assert order(waiters, {}, limit=3) == order(waiters, {})[:3]
    assert order(waiters, {}, limit=99) == order(waiters, {})


def test_order_keeps_fifo_within_each_tenant() -> None:
    waiters = [w("abc"[i % 3], tokens=10 * (i % 5 + 1), weight=1 + i % 2) for i in range(30)]
    got = order(waiters, {"a": 40.0, "b": 0.0, "c": 7.0})
    assert sorted(got) == list(range(30))
    for tenant in "abc":
        mine = [i for i in got if waiters[i].tenant == tenant]
        assert mine == sorted(mine)


@pytest.mark.parametrize(("before", "waiting", "last", "running", "after"), [
    (None, [], 0.0, 0.0, 0.0),  # the first ever: nothing to lift to
    (None, [], 50.0, 0.0, 50.0),  # none waits: the counter of the tenant served last
    (10.0, [30.0, 20.0], 99.0, 0.0, 20.0),  # the least counter of those waiting
    (25.0, [30.0, 20.0], 0.0, 0.0, 25.0),  # above it already: kept (no credit lost either)
    (5.0, [30.0, 20.0], 0.0, 12.0, 8.0),  # its running answers count: live 20, not 5
    (10.0, [30.0], 0.0, 25.0, 10.0),  # live 35 > 30: not lifted
])
def test_lift(before: float | None, waiting: list[float], last: float, running: float,
              after: float) -> None:
    counters = Counters()
    if before is not None:
        counters.served["t"] = before
    counters.last = last
    counters.lift("t", waiting, running)
    assert counters.get("t") == after


def test_charge_by_weight_and_granted_sets_the_lift_for_an_empty_line() -> None:
    counters = Counters()
    counters.charge("a", 300, weight=3)
    counters.charge("a", 50)
    assert counters.get("a") == 150.0
    counters.granted("a")
    counters.lift("newcomer", [])
    assert counters.get("newcomer") == 150.0


def test_trim_keeps_the_busy_and_drops_the_lowest_idle() -> None:
    counters = Counters(limit=8)
    for i in range(8):
        counters.served[f"t{i}"] = float(i)
    counters.trim([])
    assert len(counters.served) == 8  # not over: nothing goes
    counters.served["t8"] = 8.0
    counters.trim(["t0", "t1"])  # over by one: one more eighth goes, the lowest idle
    assert set(counters.served) == {"t0", "t1", "t4", "t5", "t6", "t7", "t8"}
    assert len(counters.served) <= counters.limit


def test_trim_never_drops_the_busy() -> None:
    counters = Counters(limit=2)
    for tenant in "abcd":
        counters.served[tenant] = 1.0
    counters.trim("abcd")
    assert set(counters.served) == set("abcd")


@pytest.mark.parametrize(("prompt", "max_tokens", "expected"), [
    (10, None, 10 + OUTPUT_PRIOR),
    (10, 5, 15),
    (0, 0, 0),
])
def test_expected_tokens(prompt: int, max_tokens: int | None, expected: int) -> None:
    assert expected_tokens(prompt, max_tokens) == expected
