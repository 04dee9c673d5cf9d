"""Which backend next, in one pure place.  No I/O, no clock.

Steering (`decide`): may a request that would wait for the primary go to a fallback
instead? Inputs are facts: the request's intent, its probability of being simple, its
size; each pool's snapshot and context window; the route's fallback rule. The output is
`Move(pool, reason)` or `Stay(why)`. `Stay.movable` says the request qualified but no
fallback had room: it may leave the primary's queue when a fallback slot frees.

Failover (`lead`, `without`, `retry_on`): where a request goes when some of its route's
backends are sick. Inputs are the route, its full chain (primary, then fallbacks, as
configured), each backend's `Standing` at one instant, and the retries in flight. The
caller takes the snapshot, asks here, then takes the probe of the backend chosen (when
the answer says so) with no await in between, so the snapshot still holds.

Neither ever sends a request to a backend that cannot serve it (`policies.scheduler.capabilities`:
tools, vision, a JSON schema, its size in the context window); the route's primary is
never second-guessed. Failover is told which backends may take the request (`able`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass

from policies.apis import Api
from policies.config import FallbackWhen, Overflow, RouteConfig, RouteFallbackConfig
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class Candidate:
    """A fallback pool as the policy sees it."""

    pool: PoolSnapshot
    context_window: int | None
    capabilities: frozenset[Capability] = ALL_CAPABILITIES
    apis: frozenset[Api] = frozenset(Api)

    @property
    def ability(self) -> Ability:
        return Ability(self.capabilities, self.context_window, self.apis)


@dataclass(frozen=True, slots=True)
class Move:
    pool: str
    reason: str  # x-slotgate-route-reason, e.g. "fallback:simple:greeting:0.97"


@dataclass(frozen=True, slots=True)
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


# Retries in flight may be about a fifth of the requests running, at least 3: a sick
# backend cannot double the load on the healthy ones.
RETRY_SHARE, RETRY_MIN = 0.2, 3


class Standing(enum.StrEnum):
    UP = "up"  # breaker closed, not waiting out a 429
    PROBE = "probe"  # breaker open, its probe is due: the next request may be the probe
    DOWN = "down"  # breaker open (probe not due), or waiting out a 429's Retry-After


@dataclass(frozen=True, slots=True)
class Plan:
    """Admit on `route`; `takes_probe`: its primary is open and this request is the probe."""

    route: RouteConfig
    takes_probe: bool = False


@dataclass(frozen=True, slots=True)
class Unavailable:
    """Nothing on the route takes new work; `backend` is the one the 503 names."""

    backend: str


@dataclass(frozen=True, slots=True)
class Retry:
    """Retry on `backend`; `takes_probe`: it is open and this retry is its probe."""

    backend: str
    takes_probe: bool = False


def lead(route: RouteConfig, chain: Sequence[str], standing: Mapping[str, Standing],
         able: Container[str] | None = None) -> Plan | Unavailable:
    """The route to admit on. A sick primary gives way to the chain's first backend that is
    up and `able` to serve the request (None: all are; the others up and able behind it,
    overflowing to them), unless its probe is due: then this request is the probe. A
    backend whose probe is due never leads in another's place."""
    primary = standing[route.primary]
    if primary is not Standing.DOWN:
        return Plan(route, takes_probe=primary is Standing.PROBE)
    healthy = [name for name in chain
               if name != route.primary and standing[name] is Standing.UP
               and (able is None or name in able)]
    if not healthy:
        return Unavailable(route.primary)
    return Plan(route.model_copy(update={"primary": healthy[0], "fallbacks": tuple(healthy[1:]),
                                         "overflow": Overflow.FALLBACK}))


def without(route: RouteConfig, name: str,
            able: Container[str] | None = None) -> RouteConfig | None:
    """`route` minus the backend `name` and those not `able` to serve the request (None:
    all are), or None when nothing would be left."""
    chain = [b for b in (route.primary, *route.fallbacks)
             if b != name and (able is None or b in able)]
    if not chain:
        return None
    return route.model_copy(update={"primary": chain[0], "fallbacks": tuple(chain[1:]),
                                    "overflow": Overflow.FALLBACK})


def retry_budget_left(retrying: int, running: int) -> bool:
    """May one more retry start, with `retrying` in flight among `running` requests?"""
    return retrying < max(RETRY_MIN, int(RETRY_SHARE * running))


def retry_on(chain: Sequence[str], failed_on: str, standing: Mapping[str, Standing],
             retrying: int, running: int, sibling: bool = False,
             able: Container[str] | None = None) -> Retry | None:
    """Where a request that failed on `failed_on` before its first byte goes next: another
    replica of the same backend when it has one that takes work (`sibling`), else the first
    backend after it in the chain that takes work (up, or its probe due) and is `able` to
    serve the request (None: all are). None when there is none (`failed_on` last, or not
    in the chain) or the retry budget is spent."""
    if not retry_budget_left(retrying, running):
        return None
    if sibling:
        return Retry(failed_on)
    if failed_on not in chain:
        return None
    later = chain[chain.index(failed_on) + 1:]
    after = next((name for name in later if standing[name] is not Standing.DOWN
                  and (able is None or name in able)), None)
    if after is None:
        return None
    return Retry(after, takes_probe=standing[after] is Standing.PROBE)
