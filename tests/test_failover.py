"""Failover (policies.scheduler.failover): the route a request is admitted on, a route without a
backend that opened, the backend a failed request is retried on; and the standing
snapshot they read."""

from __future__ import annotations

import pytest

from policies.config import Overflow, RouteConfig
from policies.health.breaker import BreakerState, CircuitBreaker
from policies.scheduler.failover import (
    RETRY_MIN,
    Plan,
    Retry,
    Standing,
    Unavailable,
    lead,
    retry_budget_left,
    retry_on,
    without,
)
from router.upstream.health import BackendHealth

UP, PROBE, DOWN = Standing.UP, Standing.PROBE, Standing.DOWN
ABC = RouteConfig(primary="a", fallbacks=("b", "c"), overflow=Overflow.REJECT)
ALONE = RouteConfig(primary="a", overflow=Overflow.REJECT)
CHAIN = ["a", "b", "c"]


def route(*names: str) -> RouteConfig:
    """The route a sick primary gives way to: overflow always goes on to the others."""
    return ABC.model_copy(update={"primary": names[0], "fallbacks": names[1:],
                                  "overflow": Overflow.FALLBACK})


def standing(a: Standing, b: Standing = UP, c: Standing = UP) -> dict[str, Standing]:
    return {"a": a, "b": b, "c": c}


@pytest.mark.parametrize(
    ("given", "chain", "now", "expected"),
    [
        (ABC, CHAIN, standing(UP, DOWN, DOWN), Plan(ABC)),  # untouched, overflow included
        (ABC, CHAIN, standing(PROBE, DOWN, DOWN), Plan(ABC, takes_probe=True)),
        (ABC, CHAIN, standing(PROBE), Plan(ABC, takes_probe=True)),  # the probe beats a move
        (ABC, CHAIN, standing(DOWN), Plan(route("b", "c"))),
        (ABC, CHAIN, standing(DOWN, DOWN), Plan(route("c"))),
        (ABC, CHAIN, standing(DOWN, UP, DOWN), Plan(route("b"))),
        # A fallback whose probe is due neither leads nor stays behind: it is not up.
        (ABC, CHAIN, standing(DOWN, PROBE, UP), Plan(route("c"))),
        (ABC, CHAIN, standing(DOWN, PROBE, PROBE), Unavailable("a")),
        (ABC, CHAIN, standing(DOWN, DOWN, DOWN), Unavailable("a")),
        (ALONE, ["a"], {"a": DOWN}, Unavailable("a")),
        (ALONE, ["a"], {"a": PROBE}, Plan(ALONE, takes_probe=True)),
        (ALONE, ["a"], {"a": UP}, Plan(ALONE)),
        # The route left after `a` opened in line, `b` leading: the ORIGINAL chain decides,
        # in its order, so `a` leads again once it is up.
        (route("b", "c"), CHAIN, standing(UP, DOWN, UP), Plan(route("a", "c"))),
        (route("b", "c"), CHAIN, standing(DOWN, DOWN, UP), Plan(route("c"))),
        (route("b", "c"), CHAIN, standing(DOWN, DOWN, DOWN), Unavailable("b")),
        (route("c"), CHAIN, standing(UP, UP, DOWN), Plan(route("a", "b"))),
    ],
)
def test_lead(given: RouteConfig, chain: list[str], now: dict[str, Standing],
              expected: Plan | Unavailable) -> None:
    assert lead(given, chain, now) == expected


@pytest.mark.parametrize(
    ("given", "name", "expected"),
    [
        (ABC, "a", route("b", "c")),
        (ABC, "b", route("a", "c")),
        (ABC, "c", route("a", "b")),
        (ABC, "x", route("a", "b", "c")),  # not on the route: the same backends, overflowing
        (route("c"), "c", None),
        (ALONE, "a", None),
    ],
)
def test_without(given: RouteConfig, name: str, expected: RouteConfig | None) -> None:
    assert without(given, name) == expected


@pytest.mark.parametrize(
    ("failed_on", "now", "retrying", "running", "expected"),
    [
        ("a", standing(DOWN), 0, 0, Retry("b")),
        ("a", standing(UP, DOWN, UP), 0, 0, Retry("c")),
        ("a", standing(UP, PROBE, UP), 0, 0, Retry("b", takes_probe=True)),
        ("a", standing(UP, DOWN, PROBE), 0, 0, Retry("c", takes_probe=True)),
        ("a", standing(UP, DOWN, DOWN), 0, 0, None),
        ("b", standing(UP), 0, 0, Retry("c")),  # never back: only later in the chain
        ("b", standing(UP, UP, DOWN), 0, 0, None),
        ("c", standing(UP), 0, 0, None),  # the last
        ("x", standing(UP), 0, 0, None),  # not in the chain
        # The budget: at least RETRY_MIN in flight, then a fifth of the running.
        ("a", standing(UP), RETRY_MIN - 1, 0, Retry("b")),
        ("a", standing(UP), RETRY_MIN, 0, None),
        ("a", standing(UP, PROBE), RETRY_MIN, 10, None),  # spent: no probe is taken either
        ("a", standing(UP), 3, 19, None),
        ("a", standing(UP), 3, 20, Retry("b")),
        ("a", standing(UP), 40, 200, None),
        ("a", standing(UP), 39, 200, Retry("b")),
    ],
)
def test_retry_on(failed_on: str, now: dict[str, Standing], retrying: int, running: int,
                  expected: Retry | None) -> None:
    assert retry_on(CHAIN, failed_on, now, retrying, running) == expected


def test_a_single_backend_route_has_nowhere_to_retry() -> None:
    assert retry_on(["a"], "a", {"a": UP}, 0, 0) is None


def test_the_retry_budget() -> None:
    assert retry_budget_left(0, 0) and retry_budget_left(2, 0) and not retry_budget_left(3, 0)
    assert not retry_budget_left(3, 10) and retry_budget_left(3, 20)
    assert not retry_budget_left(4, 24) and retry_budget_left(4, 25)  # int(0.2 * 25) == 5


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def opened(clock: Clock) -> CircuitBreaker:
    breaker = CircuitBreaker(1, 10.0, clock)
    breaker.failure()
    assert breaker.state is BreakerState.OPEN
    return breaker


def test_asking_whether_a_probe_is_due_changes_nothing() -> None:
    clock = Clock()
    breaker = opened(clock)
    assert not breaker.probe_due()
    clock.now += 10.0
    for _ in range(3):
        assert breaker.probe_due()
    assert (breaker.state, breaker.opened_at) == (BreakerState.OPEN, 100.0)
    assert breaker.allow() and breaker.state is BreakerState.HALF_OPEN  # the probe goes
    assert not breaker.probe_due() and not breaker.allow()  # one per period
    clock.now += 10.0
    assert breaker.probe_due() and breaker.state is BreakerState.HALF_OPEN  # it never reported
    breaker.success()
    assert not breaker.probe_due() and breaker.allow()  # closed: calls go, no probe


def test_the_standing_snapshot_and_taking_the_probe() -> None:
    clock, health = Clock(), BackendHealth()
    health.breakers = {"a": opened(clock), "b": CircuitBreaker(1, 10.0, clock),
                       "c": opened(clock)}
    clock.now += 10.0  # the probes of a and c are due
    health.throttle("c", 60.0)  # but c said 429
    now = health.standing(["a", "b", "c", "unknown"])
    assert now == {"a": PROBE, "b": UP, "c": DOWN, "unknown": UP}
    assert health.standing(["a"]) == {"a": PROBE}  # asking took nothing
    assert [health.is_open(n) for n in "abc"] == [True, False, True]
    assert health.take_probe("a") and health.standing(["a"]) == {"a": DOWN}
    assert not health.take_probe("a")  # one per period
    assert not health.take_probe("b") and not health.take_probe("unknown")  # none to take


def test_lead_over_a_standing_snapshot_takes_the_primarys_probe_once() -> None:
    """As dispatch does it: snapshot, decide, take the probe, with nothing in between."""
    clock, health = Clock(), BackendHealth()
    health.breakers = {"a": opened(clock)}

    def admit_on() -> RouteConfig | Unavailable:
        plan = lead(ABC, CHAIN, health.standing(CHAIN))
        if isinstance(plan, Unavailable):
            return plan
        if plan.takes_probe:
            assert health.take_probe(plan.route.primary)
        return plan.route

    assert admit_on() == route("b", "c")
    clock.now += 10.0
    assert admit_on() == ABC  # the probe
    assert health.breakers["a"].state is BreakerState.HALF_OPEN
    assert admit_on() == route("b", "c")  # taken: the next one moves
    health.breakers["b"] = opened(clock)
    health.throttle("c", 60.0)
    assert admit_on() == Unavailable("a")
    # the soonest any of them may take a request: a's half-open breaker, now (the
    # refusal's Retry-After is then the floor; tests/test_rejections.py)
    assert health.retry_in_s(CHAIN) == 0.0
