"""May a request that would wait for the primary go to a fallback instead?  Pure.

Inputs are facts: the request's intent, its probability of being simple, its size;
each pool's snapshot and context window; the route's fallback rule. The output is
`Move(pool, reason)` or `Stay(why)`. `Stay.movable` says the request qualified but no
fallback had room: it may leave the primary's queue when a fallback slot frees.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from policies.config import FallbackWhen, RouteFallbackConfig
from policies.eta import queue_wait_s
from policies.slots import PoolSnapshot

# Output budget assumed when the request sets no max_tokens, for the context-window check.
DEFAULT_OUTPUT_TOKENS = 1024


class StayReason(enum.StrEnum):
    NEVER = "never"
    PRIMARY_FREE = "primary_free"
    INTENT = "intent"
    CONFIDENCE = "confidence"
    NO_ROOM = "no_room"  # qualified, but no fallback fits or has room or a shorter wait


@dataclass(frozen=True, slots=True)
class RequestFacts:
    intent: str
    p_simple: float
    prompt_tokens: int
    max_tokens: int | None


@dataclass(frozen=True, slots=True)
class Candidate:
    """A fallback pool as the policy sees it."""

    pool: PoolSnapshot
    context_window: int | None


@dataclass(frozen=True, slots=True)
class Move:
    pool: str
    reason: str  # x-slotgate-route-reason, e.g. "fallback:simple:greeting:0.97"


@dataclass(frozen=True, slots=True)
class Stay:
    why: StayReason
    movable: tuple[str, ...] = ()  # fallbacks the request may still move to later


def decide(
    facts: RequestFacts,
    primary: PoolSnapshot,
    fallbacks: Sequence[Candidate],
    rule: RouteFallbackConfig,
) -> Move | Stay:
    if rule.when is FallbackWhen.NEVER:
        return Stay(StayReason.NEVER)
    saturated = primary.free == 0 or primary.queued > 0
    if rule.when is FallbackWhen.SATURATED and not saturated:
        return Stay(StayReason.PRIMARY_FREE)
    if facts.intent not in rule.intents:
        return Stay(StayReason.INTENT)
    if facts.p_simple < rule.min_confidence:
        return Stay(StayReason.CONFIDENCE)
    reason = f"fallback:simple:{facts.intent}:{facts.p_simple:.2f}"
    fitting = [c for c in fallbacks if fits(facts, c.context_window)]
    for c in fitting:
        if c.pool.free > 0 and c.pool.queued == 0:
            return Move(c.pool.name, reason)
    primary_wait = queue_wait_s(primary, primary.queued + 1) if saturated else 0.0
    for c in fitting:
        if c.pool.queue_room > 0 and (
            rule.when is FallbackWhen.ALWAYS
            or queue_wait_s(c.pool, c.pool.queued + 1) < primary_wait
        ):
            return Move(c.pool.name, reason)
    return Stay(StayReason.NO_ROOM, tuple(c.pool.name for c in fitting))


def fits(facts: RequestFacts, context_window: int | None) -> bool:
    if context_window is None:
        return True
    output = facts.max_tokens if facts.max_tokens is not None else DEFAULT_OUTPUT_TOKENS
    return facts.prompt_tokens + output <= context_window


def estimate_tokens(text_chars: int, text_bytes: int) -> int:
    """A cheap, generous token estimate from a text's UTF-8 size.

    About four ASCII characters make a token; a CJK character (three UTF-8 bytes) is
    about one. Overestimating only keeps a request on the primary.
    """
    multibyte = text_bytes - text_chars  # two extra bytes per CJK character
    return max(1, text_chars // 4 + multibyte // 2)
