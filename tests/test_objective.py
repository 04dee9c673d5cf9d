"""policies.scheduler.objective: the cheapest option that meets the TTFT objective; else the fastest
(critical, standard) or an early shed with a Retry-After (sheddable); never a downgrade of a
complex request, never a backend that cannot serve the request."""

from __future__ import annotations

import math

import pytest

from policies.config import FallbackWhen, Priority, RouteFallbackConfig
from policies.scheduler.capabilities import Lack
from policies.scheduler.objective import Choice, Option, OptionKind, choose, qualifies

PRIMARY, SMALL, OVERFLOW, SHED = (OptionKind.PRIMARY, OptionKind.SMALL, OptionKind.OVERFLOW,
                                  OptionKind.SHED)
CRITICAL, STANDARD, SHEDDABLE = Priority.CRITICAL, Priority.STANDARD, Priority.SHEDDABLE
OBJECTIVE = 5.0  # seconds to first token


def big(ttft: float, cost: float = 0.010) -> Option:
    return Option(PRIMARY, "big", ttft, cost)


def small(ttft: float, cost: float = 0.001, lack: Lack | None = None) -> Option:
    return Option(SMALL, "small", ttft, cost, lack)


def cloud(ttft: float, cost: float = 0.030, lack: Lack | None = None) -> Option:
    return Option(OVERFLOW, "cloud", ttft, cost, lack)


def went(kind: OptionKind, backend: str, how: str) -> Choice:
    return Choice(kind, backend, f"objective:{how}:{kind.value}")


@pytest.mark.parametrize(
    ("options", "priority", "downgrade", "expected"),
    [
        # The primary meets the objective and is the cheapest: it waits there.
        ([big(1.0), cloud(0.5)], STANDARD, True, went(PRIMARY, "big", "met")),
        # The primary's line is too long: the small model now ...
        ([big(30.0), small(0.4), cloud(0.5)], STANDARD, True, went(SMALL, "small", "met")),
        # ... or after its own line, when that still meets the objective.
        ([big(30.0), small(4.5), cloud(0.5)], STANDARD, True, went(SMALL, "small", "met")),
        # The small model's line too long as well: the serverless overflow.
        ([big(30.0), small(9.0), cloud(0.8)], STANDARD, True,
         went(OVERFLOW, "cloud", "met")),
        # The cheapest that meets it wins, not the fastest.
        ([big(2.0), small(0.3), cloud(0.1)], STANDARD, True, went(SMALL, "small", "met")),
        ([big(2.0, cost=0.05), cloud(4.0, cost=0.02)], STANDARD, False,
         went(OVERFLOW, "cloud", "met")),
        # Equal costs: the faster; equal in both: the primary.
        ([big(4.0, cost=0.01), cloud(1.0, cost=0.01)], STANDARD, False,
         went(OVERFLOW, "cloud", "met")),
        ([big(1.0, cost=0.01), cloud(1.0, cost=0.01)], STANDARD, False,
         went(PRIMARY, "big", "met")),
        # Exactly at the objective meets it.
        ([big(OBJECTIVE), cloud(0.1)], STANDARD, False, went(PRIMARY, "big", "met")),
        # Nothing meets it: the lowest predicted TTFT for standard and critical ...
        ([big(30.0), small(20.0), cloud(12.0)], STANDARD, True,
         went(OVERFLOW, "cloud", "best_effort")),
        ([big(30.0), small(9.0), cloud(12.0)], CRITICAL, True,
         went(SMALL, "small", "best_effort")),
        ([big(30.0)], CRITICAL, True, went(PRIMARY, "big", "best_effort")),
        ([big(math.inf), cloud(math.inf)], CRITICAL, True,
         went(PRIMARY, "big", "best_effort")),
        # ... an early shed for sheddable, told when the forecast meets it again (the
        # refusal table rounds and clamps it: tests/test_rejections.py).
        ([big(30.0), small(20.0), cloud(12.0)], SHEDDABLE, True,
         Choice(SHED, None, "objective:shed", 7.0)),
        ([big(5.5)], SHEDDABLE, True, Choice(SHED, None, "objective:shed", 0.5)),
        ([big(500.0)], SHEDDABLE, True, Choice(SHED, None, "objective:shed", 495.0)),
        ([big(math.inf)], SHEDDABLE, True, Choice(SHED, None, "objective:shed", math.inf)),
        # A sheddable request that can meet it is served as any other.
        ([big(30.0), small(1.0)], SHEDDABLE, True, went(SMALL, "small", "met")),
        # A complex request is never downgraded for speed (nor for cost) ...
        ([big(2.0), small(0.3)], STANDARD, False, went(PRIMARY, "big", "met")),
        ([big(30.0), small(0.3)], STANDARD, False, went(PRIMARY, "big", "best_effort")),
        ([big(30.0), small(0.3)], CRITICAL, False, went(PRIMARY, "big", "best_effort")),
        ([big(30.0), small(0.3), cloud(3.0)], STANDARD, False,
         went(OVERFLOW, "cloud", "met")),  # ... the same model class elsewhere is fine
        ([big(30.0), small(0.3)], SHEDDABLE, False, Choice(SHED, None, "objective:shed", 25)),
    ],
)
def test_choose(options: list[Option], priority: Priority, downgrade: bool,
                expected: Choice) -> None:
    assert choose(options, priority, OBJECTIVE, downgrade) == expected


@pytest.mark.parametrize("lack", list(Lack))
@pytest.mark.parametrize("priority", list(Priority))
def test_never_to_a_backend_that_cannot_serve(lack: Lack, priority: Priority) -> None:
    """Tools, images, a JSON schema or a long prompt: never moved where they cannot be
    served, however cheap or fast; kept on the primary, and the reason says why."""
    both = [big(2.0), small(0.3, lack=lack), cloud(0.5, cost=0.001, lack=lack)]
    assert choose(both, priority, OBJECTIVE, True) == Choice(PRIMARY, "big",
                                                             f"primary:needs:{lack.value}")
    slow = [big(30.0), small(0.3, lack=lack), cloud(0.5, lack=lack)]
    chosen = choose(slow, priority, OBJECTIVE, True)
    if priority is SHEDDABLE:
        assert chosen == Choice(SHED, None, "objective:shed", 25)
    else:
        assert chosen == Choice(PRIMARY, "big", f"primary:needs:{lack.value}")


def test_a_backend_that_serves_it_is_taken_when_another_lacks() -> None:
    options = [big(30.0), small(0.3, lack=Lack.TOOLS), cloud(1.0)]
    assert choose(options, STANDARD, OBJECTIVE, True) == went(OVERFLOW, "cloud", "met")


def test_a_lack_is_not_the_reason_when_the_option_was_no_better() -> None:
    options = [big(1.0, cost=0.001), small(0.3, cost=0.002, lack=Lack.VISION)]
    assert choose(options, STANDARD, OBJECTIVE, True) == went(PRIMARY, "big", "met")


def test_a_complex_request_stays_for_its_intent_not_a_lack() -> None:
    options = [big(2.0), small(0.3, lack=Lack.TOOLS)]
    assert choose(options, STANDARD, OBJECTIVE, False) == went(PRIMARY, "big", "met")


def test_critical_is_never_shed_by_the_objective() -> None:
    for ttft in (5.1, 60.0, 1e6, math.inf):
        chosen = choose([big(ttft), small(ttft * 2)], CRITICAL, OBJECTIVE, True)
        assert chosen.kind is not SHED and chosen.retry_in_s is None


def test_no_objective_is_met_by_every_option() -> None:
    options = [big(300.0), small(900.0), cloud(1.0)]
    assert choose(options, SHEDDABLE, None, True) == went(SMALL, "small", "met")


def test_a_shed_is_told_how_late_the_line_makes_it() -> None:
    """The fastest option's TTFT less the objective, as forecast (the refusal table clamps
    it to the server's bounds: tests/test_rejections.py)."""
    chosen = choose([big(100.0)], SHEDDABLE, OBJECTIVE, True)
    assert chosen.retry_in_s == pytest.approx(100.0 - OBJECTIVE)
    chosen = choose([big(7.0), cloud(6.0)], SHEDDABLE, OBJECTIVE, True)
    assert chosen.retry_in_s == pytest.approx(6.0 - OBJECTIVE)  # the fastest option


def test_the_options_must_hold_the_primary_and_no_shed() -> None:
    with pytest.raises(ValueError, match="primary"):
        choose([small(1.0)], STANDARD, OBJECTIVE, True)
    with pytest.raises(ValueError, match="shedding"):
        choose([big(1.0), Option(SHED, "x", 0.0, 0.0)], STANDARD, OBJECTIVE, True)


@pytest.mark.parametrize(
    ("intent", "p", "rule", "expected"),
    [
        ("greeting", 0.9, RouteFallbackConfig(), True),
        ("greeting", 0.79, RouteFallbackConfig(), False),
        ("greeting", 0.8, RouteFallbackConfig(when=FallbackWhen.ALWAYS), True),
        ("greeting", 0.9, RouteFallbackConfig(when=FallbackWhen.NEVER), False),
        ("code", 0.99, RouteFallbackConfig(), False),
        ("math", 0.99, RouteFallbackConfig(when=FallbackWhen.ALWAYS), False),
        ("translate", 0.99, RouteFallbackConfig(intents=frozenset({"greeting"})), False),
    ],
)
def test_qualifies(intent: str, p: float, rule: RouteFallbackConfig, expected: bool) -> None:
    assert qualifies(intent, p, rule) is expected
