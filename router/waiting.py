"""Taking a slot for one request: admission, steering to a fallback, and the wait in line.

The decisions come from `policies` (admission, fallback); this module carries them out.
A stream that has to wait gets its 200 at once and hears its place in line. A waiter
leaves the line at once when its client leaves (its handler is cancelled and the ticket
withdrawn), when the gateway starts draining, when its backend fails, or, on a steering
route, the moment a fallback slot frees for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

from classifier.text import request_text
from policies.admission import Decision, Reject, RejectReason, Wait, decide
from policies.brevity import lean_simple
from policies.config import FallbackWhen, RouteConfig
from policies.fallback import Candidate, Move, RequestFacts, Stay
from policies.fallback import decide as steer_by_intent
from policies.objective import Choice, OptionKind, choose, qualifies
from policies.slots import Lease, PoolSnapshot, QueueShed, QueueTimeout, SlotPool, Ticket
from policies.slots.handover import MoveOffers
from router.backend import Backend
from router.exchange import Exchange
from router.openai_api import ParsedRequest
from router.record import Phase
from router.request import objective
from router.request.options import options
from router.request.waits import Interrupt, abandon
from router.upstream.health import BackendOpened
from router.upstream.proxy import ClientGone

_ADMIT_ATTEMPTS = 3  # a snapshot can go stale only with a shared (Redis) pool


async def admit(ex: Exchange, parsed: ParsedRequest, route: RouteConfig) -> Lease:
    """Route -> admit -> (steer to a fallback) -> take a slot or a place in line."""
    backends, rec = ex.gw.backends, ex.rec
    primary = backends[route.primary].pool
    fallbacks = [backends[name].pool for name in route.fallbacks]

    def next_slot_s(pool: PoolSnapshot) -> float:  # the pool's own forecast
        return backends[pool.name].pool.forecast(1)

    for _ in range(_ADMIT_ATTEMPTS):
        decision = decide(
            primary.snapshot(), [p.snapshot() for p in fallbacks], route.overflow, ex.priority,
            forecast=next_slot_s, able=ex.able(parsed, route.primary),
        )
        if isinstance(decision, Reject):
            raise ex.rejection(decision.reason, decision.retry_in_s, primary.name)
        target, reason, movable = decision.pool, decision.reason.value, None
        if (route.fallback.when is FallbackWhen.OBJECTIVE and isinstance(decision, Wait)
                and target == primary.name):  # (a full line overflows as configured)
            choice = aim(ex, parsed, route)
            if choice.backend is None:
                assert choice.retry_in_s is not None
                raise ex.rejection(RejectReason.OBJECTIVE, choice.retry_in_s,
                                   primary.name)
            target, reason = choice.backend, choice.reason
        elif target == primary.name and _may_steer(route, decision):
            step = steer(ex, parsed, route)
            if isinstance(step, Move):
                target, reason = step.pool, step.reason
            elif step.movable:
                movable = step.movable[0]
            else:
                reason = step.reason or reason  # primary:needs:<what a fallback lacks>
        backend = backends[target]
        rec.backend, rec.reason = target, reason
        lease = await take(ex, parsed, backend, movable)
        if lease is not None:
            return lease
    raise ex.rejection(RejectReason.QUEUE_FULL, ex.retry_after([primary, *fallbacks]),
                       primary.name)


async def admit_to(ex: Exchange, parsed: ParsedRequest, backend: str) -> Lease:
    """A slot on one given backend (a retry): free now, or after waiting in its line."""
    group = ex.gw.backends[backend]
    ex.rec.backend = backend
    lease = await take(ex, parsed, group, None)
    if lease is None:
        raise ex.rejection(RejectReason.QUEUE_FULL, ex.retry_after([group.pool]), backend)
    return lease


async def take(ex: Exchange, parsed: ParsedRequest, backend: Backend,
               movable: str | None) -> Lease | None:
    """A free slot on `backend` (its group's pick first), else one after a wait in its
    line (pinned to the replica holding the prompt's prefix while the pick says to wait
    for it; `movable`: a fallback it may move to meanwhile); None when the line is full."""
    pool = backend.pool
    first = ex.prefer(backend, parsed)
    if not ex.hold_s:
        lease = await pool.try_acquire(first, ex.fair_share(backend, parsed))
        if lease is not None:
            objective.predict(ex.rec, backend, 0.0, parsed.max_tokens)
            return lease
    ticket = await pool.enqueue(ex.priority, ex.want, parsed.max_tokens, ex.share(parsed),
                                ex.hold_s)
    if ticket is None:
        return None
    objective.predict(ex.rec, backend, ticket.eta_s(), parsed.max_tokens)
    return await wait(ex, parsed, pool, ticket, movable)


def _may_steer(route: RouteConfig, decision: Decision) -> bool:
    """The classifier runs only where its answer can change the outcome."""
    when = route.fallback.when
    return when is FallbackWhen.ALWAYS or (
        when is FallbackWhen.SATURATED and isinstance(decision, Wait)
    )


def classify(ex: Exchange, parsed: ParsedRequest, route: RouteConfig) -> RequestFacts:
    """The request's intent and how likely it is simple (classified once)."""
    gw, rec = ex.gw, ex.rec
    if ex.facts is None:
        assert gw.classifier is not None, "steering routes load the classifier at startup"
        began = time.perf_counter()
        text = request_text(parsed.body)
        prediction = gw.classifier.predict(text)
        gw.metrics.classifier.observe(time.perf_counter() - began)
        intents = route.fallback.intents
        p_simple = lean_simple(prediction.p_simple(intents), prediction.intent, intents,
                               parsed.max_tokens, text)  # brevity leans simple
        ex.facts = RequestFacts(
            prediction.intent, p_simple,
            ex.prompt_tokens(parsed), parsed.max_tokens, ex.needs(parsed).capabilities,
            parsed.endpoint.api,
        )
        rec.intent, rec.p_simple = ex.facts.intent, round(ex.facts.p_simple, 4)
        if ex.trace is not None:
            ex.trace.classified(began, ex.facts.intent, ex.facts.p_simple,
                                qualifies(ex.facts.intent, ex.facts.p_simple, route.fallback))
    return ex.facts


def steer(ex: Exchange, parsed: ParsedRequest, route: RouteConfig) -> Move | Stay:
    """Classify once, then ask the fallback policy whether to leave the primary."""
    facts, gw, backends = classify(ex, parsed, route), ex.gw, ex.config.backends
    candidates = [
        Candidate(gw.backends[name].pool.snapshot(), backends[name].context_window,
                  frozenset(backends[name].capabilities), backends[name].served_apis)
        for name in route.fallbacks
    ]

    def wait(pool: PoolSnapshot) -> float:  # the pool's own forecast, as admission's
        return gw.backends[pool.name].pool.forecast(pool.queued + 1)

    return steer_by_intent(facts, gw.backends[route.primary].pool.snapshot(), candidates,
                           route.fallback, wait=wait)


def aim(ex: Exchange, parsed: ParsedRequest, route: RouteConfig) -> Choice:
    """An objective-driven route's choice for a request that would wait for its primary:
    the options forecast, the request classified only if the small model is among them."""
    found = options(ex, parsed, route)
    downgrade = False
    if any(o.kind is OptionKind.SMALL and o.lack is None for o in found):
        facts = classify(ex, parsed, route)
        downgrade = qualifies(facts.intent, facts.p_simple, route.fallback)
    objective_s = None if ex.rec.slo_ttft_ms is None else ex.rec.slo_ttft_ms / 1000
    return choose(found, ex.priority, objective_s, downgrade)


async def wait(ex: Exchange, parsed: ParsedRequest, pool: SlotPool, ticket: Ticket,
               movable: str | None) -> Lease:
    """Wait in `pool`'s line with `ticket` (or move to the fallback `movable`)."""
    rec, backend = ex.rec, ex.gw.backends[pool.name]
    rec.phase = Phase.QUEUED
    queued_at = time.perf_counter()
    if ex.trace is not None:
        ex.trace.queued(pool.name, ticket.position, queued_at)
    outcome = "left"  # its client, a drain or its backend's breaker took it out of line
    reporter = None
    if parsed.stream:
        try:
            if ex.response is None:  # a retry that queues again keeps its response
                await ex.open_stream()
            assert ex.response is not None
            await backend.reporter.listen(ex.request, ex.response, ticket,
                                          ex.wants_events(parsed),
                                          ex.config.server.queue_heartbeat_s, ex.dialect)
        except BaseException as exc:
            await ticket.withdraw()
            if isinstance(exc, ConnectionResetError):
                raise ClientGone from None
            raise
        reporter = backend.reporter
    timeout = ex.config.backends[pool.name].queue_timeout_s
    try:
        if movable is None:
            waiting = ticket.wait(timeout)
        else:
            offers = ex.gw.backends[movable].offers
            assert offers is not None, "assembly offers moves onto every steering fallback"
            waiting = wait_or_move(ex, ticket, timeout, offers)
        lease = await unless_draining(ex, waiting, pool.name)
        outcome = "granted" if rec.backend == pool.name else "moved"
    except QueueTimeout:
        outcome = "timed_out"
        raise ex.rejection(RejectReason.QUEUE_TIMEOUT, ex.retry_after([pool]),
                           pool.name) from None
    except QueueShed:
        outcome = "shed"
        raise ex.rejection(RejectReason.SHED, ex.retry_after([pool]), pool.name) from None
    finally:
        if reporter is not None:
            reporter.leave(ticket)  # from here on, only this handler writes its stream
        rec.queue_wait_ms = (time.perf_counter() - queued_at) * 1000
        ex.gw.metrics.queue_wait.labels(pool.name).observe(rec.queue_wait_ms / 1000)
        if ex.trace is not None:
            ex.trace.dequeued(outcome, rec.queue_wait_ms)
    return lease


async def unless_draining(ex: Exchange, waiting: Awaitable[Lease], pool: str) -> Lease:
    """A slot from `waiting`, unless the gateway starts draining first (the request
    leaves the line, passing on any slot it got, and is answered 503) or the pool's
    backend fails meanwhile (it leaves the line: `BackendOpened`).

    Either signal cancels this handler's own wait, as a client leaving does (no task
    or `asyncio.wait` per waiter: thousands may queue); the wait then withdraws."""
    cut = Interrupt(ex.request.task)
    drain, opened = ex.gw.drain_signal(), ex.gw.health.opened(pool)
    drain.add_done_callback(cut.draining)
    opened.add_done_callback(cut.opened)
    try:
        return await waiting
    except asyncio.CancelledError:
        if not cut.why or cut.task.uncancel() > 0:  # not ours, or the client left as well
            raise
    finally:
        cut.why = cut.why or "done"
        drain.remove_done_callback(cut.draining)
        opened.remove_done_callback(cut.opened)
    if cut.why == "opened":  # even with a slot granted at the same instant (passed on)
        raise BackendOpened(pool)
    raise ex.rejection(RejectReason.DRAINING, 0, pool)


async def wait_or_move(ex: Exchange, ticket: Ticket, limit_s: float,
                       offers: MoveOffers) -> Lease:
    """Wait for the primary, or leave its queue the moment a fallback slot frees."""
    offer = offers.offer()
    waiting = asyncio.ensure_future(ticket.wait(limit_s))
    try:
        either: set[asyncio.Future[Any]] = {waiting, offer}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        offers.withdraw(offer)
        await abandon(waiting)  # the ticket leaves the queue and passes on any slot it got
        raise
    if waiting.done():
        offers.withdraw(offer)  # also returns a fallback slot granted at the same instant
        return waiting.result()
    try:
        await abandon(waiting)  # leave the primary's queue; the client may leave meanwhile
    except BaseException:
        offers.withdraw(offer)  # then the fallback's slot goes back, unused
        raise
    assert ex.facts is not None
    ex.rec.backend = offers.pool.name
    ex.rec.reason = f"fallback:simple:{ex.facts.intent}:{ex.facts.p_simple:.2f}"
    return offer.result()
