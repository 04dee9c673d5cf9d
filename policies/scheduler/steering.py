"""Steering, in one pure place: may a request that would wait for the primary go to a
fallback instead? No I/O, no clock.

Inputs are facts: the request's intent, its probability of being simple, its size; each
pool's snapshot and context window; the route's fallback rule. The output is
`Move(pool, reason)` or `Stay(why)`. `Stay.movable` says the request qualified but no
fallback had room: it may leave the primary's queue when a fallback slot frees.

It never sends a request to a backend that cannot serve it
(`policies.scheduler.capabilities`: tools, vision, a JSON schema, its size in the context
window); the route's primary is never second-guessed.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from policies.apis import Api
from policies.config import FallbackWhen, RouteFallbackConfig
from policies.scheduler.capabilities import (
    ALL_CAPABILITIES,
    Ability,
    Capability,
    Lack,
    Needs,
    first_lack,
    serves,
    size,
)
from policies.slots import PoolSnapshot


class StayReason(enum.StrEnum):
    NEVER = "never"
    PRIMARY_FREE = "primary_free"
    INTENT = "intent"
    CONFIDENCE = "confidence"
    NO_ROOM = "no_room"  # qualified, but no fallback that serves it has room or a shorter wait
    NEEDS = "needs"  # qualified, but no fallback serves it (`Stay.lack` says what it lacks)


# Not frozen, though never changed once made: made for every decision that reaches this
# stage, and a frozen dataclass sets each field through object.__setattr__
# (policies/scheduler/decision.py).
@dataclass(slots=True)
class RequestFacts:
    intent: str
    p_simple: float
    prompt_tokens: int
    max_tokens: int | None
    capabilities: frozenset[Capability] = frozenset()  # what it needs beyond plain chat
    api: Api | None = None  # the client API it came on (None: any backend's will do)

    @property
    def needs(self) -> Needs:
        return Needs(self.capabilities, size(self.prompt_tokens, self.max_tokens), self.api)


@dataclass(slots=True)
class Candidate:
    """A fallback pool as the policy sees it."""

    pool: PoolSnapshot
    context_window: int | None
    capabilities: frozenset[Capability] = ALL_CAPABILITIES
    apis: frozenset[Api] = frozenset(Api)

    @property
    def ability(self) -> Ability:
        return Ability(self.capabilities, self.context_window, self.apis)


@dataclass(slots=True)
class Move:
    pool: str
    reason: str  # x-slotgate-route-reason, e.g. "fallback:simple:greeting:0.97"


@dataclass(slots=True)
class Stay:
    why: StayReason
    movable: tuple[str, ...] = ()  # fallbacks the request may still move to later
    lack: Lack | None = None  # with NEEDS: what the (first) fallback lacks

    @property
    def reason(self) -> str | None:
        """The route reason when a lack kept the request in place: `primary:needs:tools`."""
        return None if self.lack is None else f"primary:needs:{self.lack.value}"


def decide(
    facts: RequestFacts,
    primary: PoolSnapshot,
    fallbacks: Sequence[Candidate],
    rule: RouteFallbackConfig,
    *,
    wait: Callable[[PoolSnapshot], float],
) -> Move | Stay:
    """Steer or stay. `wait(pool)`: the pool's own forecast of a newcomer's wait in its
    line (the one admission refuses on), asked only when the primary is saturated."""
    if rule.when is FallbackWhen.NEVER:
        return Stay(StayReason.NEVER)
    saturated = not primary.open
    if rule.when is FallbackWhen.SATURATED and not saturated:
        return Stay(StayReason.PRIMARY_FREE)
    if facts.intent not in rule.intents:
        return Stay(StayReason.INTENT)
    if facts.p_simple < rule.min_confidence:
        return Stay(StayReason.CONFIDENCE)
    reason = f"fallback:simple:{facts.intent}:{facts.p_simple:.2f}"
    needs = facts.needs
    fitting = [c for c in fallbacks if serves(needs, c.ability)]
    if not fitting:
        lack = first_lack(needs, [c.ability for c in fallbacks])
        return Stay(StayReason.NEEDS, lack=lack) if lack else Stay(StayReason.NO_ROOM)
    for c in fitting:
        if c.pool.open:
            return Move(c.pool.name, reason)
    primary_wait = wait(primary) if saturated else 0.0
    for c in fitting:
        if c.pool.queue_room > 0 and (
            rule.when is FallbackWhen.ALWAYS or wait(c.pool) < primary_wait
        ):
            return Move(c.pool.name, reason)
    return Stay(StayReason.NO_ROOM, tuple(c.pool.name for c in fitting))
