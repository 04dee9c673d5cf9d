"""Where a request goes to meet its time-to-first-token objective at the least cost.  Pure:
a snapshot of the options in, a typed choice out; no I/O, no clock.

The options: wait for the route's primary; the small model, now or after its own line (a
downgrade); a serverless overflow backend (the route's model class elsewhere: no
downgrade); or, for a sheddable request, a 429 now. Each comes with its predicted time to
first token and its predicted cost (`policies.pricing.costs`), and what its backend lacks to
serve the request (`policies.scheduler.capabilities`).

The rule: the cheapest option that meets the objective. If none does, the best effort (the
lowest predicted TTFT) for a critical or standard request; a sheddable one is shed at once,
with a Retry-After from the forecast, rather than left to time out in line. An option
whose backend cannot serve the request is never taken (the primary excepted: the route
chose it), and the small model only for a request that qualifies for a downgrade: a
complex request is never downgraded for speed alone.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from policies.config import FallbackWhen, Priority, RouteFallbackConfig
from policies.scheduler.capabilities import Lack


class OptionKind(enum.StrEnum):
    PRIMARY = "primary"  # wait for the route's primary (now or after its line)
    SMALL = "small"  # the small model, now or after its own line: a downgrade
    OVERFLOW = "overflow"  # a serverless overflow backend of the route's model class
    SHED = "shed"  # 429 now, with a Retry-After (a sheddable request only)


# Not frozen, though never changed once made: made for every decision that reaches this
# stage, and a frozen dataclass sets each field through object.__setattr__
# (policies/scheduler/decision.py).
@dataclass(slots=True)
class Option:
    """One place the request could go, as forecast now."""

    kind: OptionKind  # not SHED: shedding is the policy's own option
    backend: str
    ttft_s: float  # predicted time to first token from now, seconds (inf: not in sight)
    cost: float  # predicted cost of the request there, in the config's currency
    lack: Lack | None = None  # what the backend lacks to serve it (None: it serves it)


@dataclass(slots=True)
class Choice:
    kind: OptionKind
    backend: str | None  # None when shed
    reason: str  # for x-slotgate-route-reason (or the shed's log)
    retry_in_s: float | None = None  # when shed: how late the line makes it now, seconds


def qualifies(intent: str, p_simple: float, rule: RouteFallbackConfig) -> bool:
    """May the request go to the small model? The gate steering uses (`steering.decide`):
    the route sends simple requests to its fallbacks (`when` not `never`; `always` as
    `saturated`: the objective, not the load, then decides), the intent is one of the
    route's `intents`, with at least `min_confidence`."""
    return (rule.when is not FallbackWhen.NEVER and intent in rule.intents
            and p_simple >= rule.min_confidence)


def choose(options: Sequence[Option], priority: Priority, objective_ttft_s: float | None,
           downgrade: bool) -> Choice:
    """The option to take. `options` must hold the primary's; `objective_ttft_s` None:
    no objective (every option meets it); `downgrade`: the request qualifies for the small
    model (`qualifies`). A shed request is told to retry once the line has moved enough
    for it to meet its objective: the fastest option's TTFT less the objective."""
    primary = next((o for o in options if o.kind is OptionKind.PRIMARY), None)
    if primary is None:
        raise ValueError("the options must include the route's primary")
    if any(o.kind is OptionKind.SHED for o in options):
        raise ValueError("shedding is the policy's own option, not an input")
    allowed = [o for o in options if _allowed(o, downgrade)]

    def meets(o: Option) -> bool:
        return objective_ttft_s is None or o.ttft_s <= objective_ttft_s

    meeting = [o for o in allowed if meets(o)]
    if meeting:
        best = min(meeting, key=_cheapest)
        lacking = [o for o in _lacking(options, downgrade) if meets(o)]
        return _choice(best, "met", [o for o in lacking if _cheapest(o) < _cheapest(best)])
    if priority is Priority.SHEDDABLE:
        assert objective_ttft_s is not None  # every option meets a missing objective
        late_s = min(o.ttft_s for o in allowed) - objective_ttft_s
        return Choice(OptionKind.SHED, None, "objective:shed", late_s)
    best = min(allowed, key=_fastest)
    lacking = _lacking(options, downgrade)
    return _choice(best, "best_effort", [o for o in lacking if _fastest(o) < _fastest(best)])


_ORDER = {OptionKind.PRIMARY: 0, OptionKind.OVERFLOW: 1, OptionKind.SMALL: 2}


def _cheapest(o: Option) -> tuple[float, float, int]:
    return (o.cost, o.ttft_s, _ORDER[o.kind])  # equal costs: the faster, then the primary


def _fastest(o: Option) -> tuple[float, float, int]:
    return (o.ttft_s, o.cost, _ORDER[o.kind])  # equal TTFTs: the cheaper, then the primary


def _allowed(o: Option, downgrade: bool) -> bool:
    if o.kind is OptionKind.PRIMARY:
        return True  # never second-guessed
    return o.lack is None and _allowed_but_for_lack(o, downgrade)


def _allowed_but_for_lack(o: Option, downgrade: bool) -> bool:
    return o.kind is OptionKind.OVERFLOW or (o.kind is OptionKind.SMALL and downgrade)


def _lacking(options: Sequence[Option], downgrade: bool) -> list[Option]:
    """The options refused only for what their backend lacks."""
    return [o for o in options if o.lack is not None and o.kind is not OptionKind.PRIMARY
            and _allowed_but_for_lack(o, downgrade)]


def _choice(best: Option, how: str, better: Sequence[Option]) -> Choice:
    """`better`: options better than `best` but refused for what their backend lacks (the
    first given names the lack). When that kept the request on its primary, the reason
    says so, as steering's does (`primary:needs:tools`)."""
    if best.kind is OptionKind.PRIMARY and better and better[0].lack is not None:
        return Choice(best.kind, best.backend, f"primary:needs:{better[0].lack.value}")
    return Choice(best.kind, best.backend, f"objective:{how}:{best.kind.value}")

