"""Failover, in one pure place: where a request goes when some of its route's backends
are sick (`lead`, `without`, `retry_on`). No I/O, no clock.

Inputs are the route, its full chain (primary, then fallbacks, as configured), each
backend's `Standing` at one instant, the retries in flight, and which backends may take
the request (`able`: what its capabilities allow). The caller takes the snapshot, asks
here, then takes the probe of the backend chosen (when the answer says so) with no await
in between, so the snapshot still holds.
"""

from __future__ import annotations

import enum
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass

from policies.config import Overflow, RouteConfig

# Retries in flight may be about a fifth of the requests running, at least 3: a sick
# backend cannot double the load on the healthy ones.
RETRY_SHARE, RETRY_MIN = 0.2, 3


class Standing(enum.StrEnum):
    UP = "up"  # breaker closed, not waiting out a 429
    PROBE = "probe"  # breaker open, its probe is due: the next request may be the probe
    DOWN = "down"  # breaker open (probe not due), or waiting out a 429's Retry-After


# Not frozen, though never changed once made: made for every request that waits, and a
# frozen dataclass sets each field through object.__setattr__ (policies/scheduler/decision.py).
@dataclass(slots=True)
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
