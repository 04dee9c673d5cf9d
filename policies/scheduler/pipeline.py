"""The scheduler: where and when one request runs, as one `Decision`, from the request's
facts (`Request`) and one view of the candidates (`View`). Pure: no I/O, no clock; the
view reads each fact of the live gateway at most once per decision, when a stage asks.

The stages, in order (each a pure function of its own module):

    health      `failover.lead`      the route without its sick backends (or the probe),
                                     or refused: backend_unavailable
    load        `admission.decide`   run on the primary, wait in its line, overflow to a
                                     fallback, or refused: queue_full
    objective   `objective.choose`   (`fallback.when: objective`, a request that would
                                     wait) the cheapest option meeting its TTFT objective,
                                     or refused: objective_shed
    steering    `steering.decide`    (`when: saturated | always`) a simple request to the
                                     small model, now or the moment a slot frees there
    replica     `pick.pick`,         on a group: the replica by mode and load, or the wait
                `pick.hold_out`      for the busy one holding its prefix

Before it, the gate (`router.dispatch.admitted`): the key, the body, the route for its
model and the key's limits, reserved once (in Redis, an atomic call: I/O, which this
function does not do); docs/architecture.md says why the limits are a gate and not a stage.

A re-decision calls the same function on a fresh view: another attempt when a shared
pool's snapshot went stale, a route whose backend failed while it waited (`without`),
and a retry before the first byte (`retry`: a sibling replica or the next backend, by
`failover.retry_on`, then the same stages from `load` on).
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import Protocol

from policies.config import FallbackWhen, Overflow, Priority, RouteConfig, RouteFallbackConfig
from policies.scheduler.admission import Reject, RejectReason, RouteReason
from policies.scheduler.admission import Wait as Queue
from policies.scheduler.admission import decide as admit
from policies.scheduler.decision import Decision, Refuse, Run, Wait
from policies.scheduler.failover import Standing, Unavailable, lead, retry_on, without
from policies.scheduler.objective import Choice, Option, OptionKind, choose, qualifies
from policies.scheduler.steering import Candidate, Move, RequestFacts
from policies.scheduler.steering import decide as steer
from policies.slots import PoolSnapshot


class Request(Protocol):
    """The request's facts, as the stages ask for them (the classifier's verdict is
    worked out on the first question, and only where it may change the outcome)."""

    @property
    def priority(self) -> Priority: ...

    @property
    def able(self) -> Container[str]: ...  # the backends that may serve it

    @property
    def objective_s(self) -> float | None: ...  # its TTFT objective (None: none)

    def classified(self, rule: RouteFallbackConfig) -> RequestFacts: ...  # by rule's intents


class Placing(Protocol):
    """A group's replica pick for the request (`pick.pick`, `pick.hold_out`)."""

    @property
    def first(self) -> tuple[str, ...]: ...  # replicas to try first for a free slot

    @property
    def holder(self) -> str | None: ...  # the replica it would rather wait for

    @property
    def hold_s(self) -> float: ...  # > 0: wait for `holder` alone that long


class View(Protocol):
    """The candidates at one instant, each fact read when a stage first asks for it."""

    def standing(self, chain: Sequence[str]) -> Mapping[str, Standing]: ...

    def recovery_s(self, chain: Sequence[str]) -> float: ...  # until one takes work again

    def pool(self, name: str) -> PoolSnapshot: ...

    def forecast(self, name: str, position: int) -> float: ...  # its line's own forecast

    def candidates(self, names: Sequence[str]) -> list[Candidate]: ...  # for steering

    def options(self, route: RouteConfig) -> list[Option]: ...  # for the objective

    def place(self, name: str) -> Placing | None: ...  # its group's pick (None: no group)


def decide(request: Request, view: View, route: RouteConfig,
           gone: Sequence[str] = ()) -> Decision:
    """Where and when the request runs on `route`, or why it does not. `gone`: backends
    whose breaker opened while it waited there (it leaves them out).

    The usual case first, in one step: a healthy primary with a free slot, on a route that
    steers only what would wait, runs there (its group's pick aside). That is what the
    stages decide for it (tests/test_scheduler.py holds the two to the same answers),
    without asking the fallbacks' health and load, which cannot change it."""
    if not gone and route.fallback.when is not FallbackWhen.ALWAYS:
        name = route.primary
        if view.standing((name,))[name] is Standing.UP and view.pool(name).open:
            return _on_replica(view, name, _PRIMARY, None, None, True)
    return in_stages(request, view, route, gone)


_PRIMARY = RouteReason.PRIMARY._value_


def in_stages(request: Request, view: View, route: RouteConfig,
              gone: Sequence[str] = ()) -> Decision:
    """`decide` through every stage, in order."""
    chain = (route.primary, *route.fallbacks)
    for name in gone:
        rest = without(route, name, request.able)
        if rest is None:
            return _unavailable(view, name, chain)
        route = rest
    plan = lead(route, chain, view.standing(chain), request.able)
    if isinstance(plan, Unavailable):
        return _unavailable(view, plan.backend, chain)
    probe = plan.route.primary if plan.takes_probe else None
    return _admitted(request, view, plan.route, probe)


def _unavailable(view: View, name: str, chain: Sequence[str]) -> Refuse:
    return Refuse(RejectReason.BACKEND_UNAVAILABLE, view.recovery_s(chain), name,
                  f"Backend '{name}' is unavailable and so are its route's fallbacks; "
                  "retry later.")


def retry(request: Request, view: View, chain: Sequence[str], failed_on: str,
          retrying: int, running: int, sibling: bool) -> Decision | None:
    """Where a request that failed on `failed_on` before its first byte goes next (None:
    nowhere, its failure stands): a sibling replica when its group has one that takes
    work, else the chain's next backend that does (`failover.retry_on`); then admitted
    there as any request, without steering."""
    again = retry_on(chain, failed_on, view.standing(chain), retrying, running,
                     sibling=sibling, able=request.able)
    if again is None:
        return None
    route = RouteConfig(primary=again.backend, fallback=_NEVER, overflow=Overflow.REJECT)
    return _admitted(request, view, route, again.backend if again.takes_probe else None,
                     f"retry:{failed_on}")


_NEVER = RouteFallbackConfig(when=FallbackWhen.NEVER)


def _admitted(request: Request, view: View, route: RouteConfig, probe: str | None,
              reason: str | None = None) -> Decision:
    """The stages from `load` on, over `route` (its health already judged)."""
    primary = view.pool(route.primary)
    fallbacks = () if primary.open else [view.pool(name) for name in route.fallbacks]
    placed = admit(primary, fallbacks, route.overflow, request.priority,
                   forecast=lambda pool: view.forecast(pool.name, 1), able=request.able)
    if isinstance(placed, Reject):
        return Refuse(placed.reason, placed.retry_in_s, route.primary)
    target, why, movable = placed.pool, reason or placed.reason._value_, None  # (no descriptor)
    waits = isinstance(placed, Queue)
    now: bool | None = not waits  # a slot open on `target` (None: not known, ask)
    waits = waits and target == route.primary
    when = route.fallback.when
    if waits and when is FallbackWhen.OBJECTIVE:  # (a full line overflows as configured)
        choice = _aim(request, view, route)
        if choice.backend is None:
            assert choice.retry_in_s is not None
            return Refuse(RejectReason.OBJECTIVE, choice.retry_in_s, route.primary)
        target, why, now = choice.backend, choice.reason, None
    elif target == route.primary and (when is FallbackWhen.ALWAYS or (
            when is FallbackWhen.SATURATED and waits)):  # where its answer may matter
        step = steer(request.classified(route.fallback), primary, view.candidates(route.fallbacks),
                     route.fallback,
                     wait=lambda pool: view.forecast(pool.name, pool.queued + 1))
        if isinstance(step, Move):
            target, why, now = step.pool, step.reason, None
        elif step.movable:
            movable = step.movable[0]
        else:
            why = step.reason or why  # primary:needs:<what a fallback lacks>
    return _on_replica(view, target, why, movable, probe, now)


def _aim(request: Request, view: View, route: RouteConfig) -> Choice:
    """The objective's choice among the route's options; the request classified only if
    the small model is among them."""
    found = view.options(route)
    downgrade = False
    if any(o.kind is OptionKind.SMALL and o.lack is None for o in found):
        facts = request.classified(route.fallback)
        downgrade = qualifies(facts.intent, facts.p_simple, route.fallback)
    return choose(found, request.priority, request.objective_s, downgrade)


def _on_replica(view: View, target: str, why: str, movable: str | None,
                probe: str | None, now: bool | None) -> Decision:
    """Run on `target` if a slot is open there (`now`: known to be, or not; None: ask),
    else wait in its line; on a group, with its replica pick (which may rather wait for
    the busy replica holding the prefix)."""
    placing = view.place(target)
    if now is None:
        now = view.pool(target).open
    if placing is None:
        return Run(target, why, probe=probe) if now else Wait(target, why, movable=movable,
                                                               probe=probe)
    if placing.hold_s > 0:
        return Wait(target, why, placing.holder, placing.hold_s, movable, probe)
    if now:
        return Run(target, why, placing.first, placing.holder, probe)
    return Wait(target, why, placing.holder, 0.0, movable, probe)

