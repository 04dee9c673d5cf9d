"""steering.decide: every condition that keeps a request on the primary or moves it."""

from __future__ import annotations

import pytest

from policies.config import FallbackWhen, RouteFallbackConfig
from policies.scheduler.capabilities import Capability, Lack, estimate_tokens
from policies.scheduler.steering import Candidate, Move, RequestFacts, Stay, StayReason, decide
from policies.slots import PoolSnapshot

SATURATED = PoolSnapshot("big", 3, 3, 4, 10, 30.0)  # a place in line: ~50 s
FREE = PoolSnapshot("big", 3, 1, 0, 10, 30.0)
SMALL_FREE = Candidate(PoolSnapshot("small", 8, 2, 0, 8, 5.0), 8192)
SMALL_BUSY_SHORT = Candidate(PoolSnapshot("small", 8, 8, 2, 8, 5.0), 8192)  # ~2 s wait
SMALL_BUSY_LONG = Candidate(PoolSnapshot("small", 1, 1, 7, 8, 60.0), 8192)  # ~480 s wait
SMALL_FULL = Candidate(PoolSnapshot("small", 8, 8, 8, 8, 5.0), 8192)
SMALL_TINY_CONTEXT = Candidate(PoolSnapshot("small", 8, 0, 0, 8, 5.0), 2048)

SMALL_PLAIN = Candidate(PoolSnapshot("plain", 8, 0, 0, 8, 5.0), 8192, frozenset())
SMALL_TOOLS_ONLY = Candidate(PoolSnapshot("small", 8, 0, 0, 8, 5.0), 8192,
                             frozenset({Capability.TOOLS}))

RULE = RouteFallbackConfig()  # when: saturated, the simple intents, min_confidence 0.8
GREETING = RequestFacts("greeting", 0.97, 20, 100)
REASON = "fallback:simple:greeting:0.97"
GREETING_TOOLS = RequestFacts("greeting", 0.97, 20, 100, frozenset({Capability.TOOLS}))
GREETING_VISION = RequestFacts("greeting", 0.97, 20, 100, frozenset({Capability.VISION}))
GREETING_SCHEMA = RequestFacts("greeting", 0.97, 20, 100, frozenset({Capability.JSON_SCHEMA}))


def wait(pool: PoolSnapshot) -> float:
    """A stand-in for a pool's own forecast of a newcomer's wait: a slot frees every mean
    hold / capacity, and the newcomer is behind the line."""
    return (pool.queued + 1) * pool.mean_hold_s / pool.capacity


@pytest.mark.parametrize(
    ("facts", "primary", "fallbacks", "rule", "expected"),
    [
        (GREETING, SATURATED, [SMALL_FREE], RULE, Move("small", REASON)),
        # The primary has a free slot: nothing to save (when: saturated).
        (GREETING, FREE, [SMALL_FREE], RULE, Stay(StayReason.PRIMARY_FREE)),
        # ... unless the operator sends every simple request to the small model.
        (GREETING, FREE, [SMALL_FREE], RouteFallbackConfig(when=FallbackWhen.ALWAYS),
         Move("small", REASON)),
        (GREETING, SATURATED, [SMALL_FREE], RouteFallbackConfig(when=FallbackWhen.NEVER),
         Stay(StayReason.NEVER)),
        # Hard intents stay, however confident.
        (RequestFacts("code", 0.99, 20, 100), SATURATED, [SMALL_FREE], RULE,
         Stay(StayReason.INTENT)),
        # An intent the route does not allow on the fallback stays.
        (RequestFacts("translate", 0.95, 20, 100), SATURATED, [SMALL_FREE],
         RouteFallbackConfig(intents=frozenset({"greeting"})), Stay(StayReason.INTENT)),
        # Under the threshold stays; at the threshold moves.
        (RequestFacts("greeting", 0.79, 20, 100), SATURATED, [SMALL_FREE], RULE,
         Stay(StayReason.CONFIDENCE)),
        (RequestFacts("greeting", 0.80, 20, 100), SATURATED, [SMALL_FREE], RULE,
         Move("small", "fallback:simple:greeting:0.80")),
        # Too long for the fallback's context window (prompt + max_tokens).
        (RequestFacts("summarize", 0.9, 1900, 200), SATURATED, [SMALL_TINY_CONTEXT], RULE,
         Stay(StayReason.NEEDS, (), Lack.CONTEXT)),
        # No max_tokens: the output prior (policies.clock.lengths) counts against the window.
        (RequestFacts("summarize", 0.9, 1850, None), SATURATED, [SMALL_TINY_CONTEXT], RULE,
         Stay(StayReason.NEEDS, (), Lack.CONTEXT)),
        (RequestFacts("summarize", 0.9, 1850, 100), SATURATED, [SMALL_TINY_CONTEXT], RULE,
         Move("small", "fallback:simple:summarize:0.90")),
        # Fallback busy but its line is shorter than the primary's: move into its queue.
        (GREETING, SATURATED, [SMALL_BUSY_SHORT], RULE, Move("small", REASON)),
        # Fallback busy with a longer line: stay, but may move when a fallback slot frees.
        (GREETING, SATURATED, [SMALL_BUSY_LONG], RULE, Stay(StayReason.NO_ROOM, ("small",))),
        # Fallback full.
        (GREETING, SATURATED, [SMALL_FULL], RULE, Stay(StayReason.NO_ROOM, ("small",))),
        # The first fallback with a free slot wins over queueing on an earlier one.
        (GREETING, SATURATED, [SMALL_BUSY_SHORT, Candidate(PoolSnapshot("edge", 2, 0, 0, 0,
                                                                        1.0), None)],
         RULE, Move("edge", REASON)),
        # A capability the fallback lacks keeps the request on the primary, and says which.
        (GREETING_TOOLS, SATURATED, [SMALL_PLAIN], RULE, Stay(StayReason.NEEDS, (), Lack.TOOLS)),
        (GREETING_VISION, FREE, [SMALL_PLAIN], RouteFallbackConfig(when=FallbackWhen.ALWAYS),
         Stay(StayReason.NEEDS, (), Lack.VISION)),
        (GREETING_SCHEMA, SATURATED, [SMALL_PLAIN], RULE,
         Stay(StayReason.NEEDS, (), Lack.JSON_SCHEMA)),
        # ... but it may go to a later fallback that serves it (the default: everything).
        (GREETING_TOOLS, SATURATED, [SMALL_PLAIN, SMALL_FREE], RULE, Move("small", REASON)),
        (GREETING_TOOLS, SATURATED, [SMALL_TOOLS_ONLY], RULE, Move("small", REASON)),
        # ... and may still move later only to a fallback that serves it.
        (GREETING_TOOLS, SATURATED, [SMALL_PLAIN, SMALL_FULL], RULE,
         Stay(StayReason.NO_ROOM, ("small",))),
        # A hard request is kept by its intent first: the lack is not why it stayed.
        (RequestFacts("code", 0.99, 20, 100, frozenset({Capability.TOOLS})), SATURATED,
         [SMALL_PLAIN], RULE, Stay(StayReason.INTENT)),
    ],
)
def test_decide(facts: RequestFacts, primary: PoolSnapshot, fallbacks: list[Candidate],
                rule: RouteFallbackConfig, expected: Move | Stay) -> None:
    assert decide(facts, primary, fallbacks, rule, wait=wait) == expected


@pytest.mark.parametrize(
    ("text", "low", "high"),
    [
        ("hello world, how are you doing today?", 8, 12),
        ("你好，今天天气怎么样？", 10, 16),
        ("", 1, 1),
    ],
)
def test_estimate_tokens_is_cheap_and_generous(text: str, low: int, high: int) -> None:
    assert low <= estimate_tokens(len(text), len(text.encode())) <= high


def test_the_route_reason_of_a_lack() -> None:
    assert Stay(StayReason.NEEDS, (), Lack.TOOLS).reason == "primary:needs:tools"
    assert Stay(StayReason.NEEDS, (), Lack.CONTEXT).reason == "primary:needs:context"
    assert Stay(StayReason.NO_ROOM).reason is None
