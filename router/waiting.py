"""Taking a slot for one request: the scheduler's decision carried out, and the wait in
line.

The decision is `policies.scheduler.pipeline`'s, over `router.candidates`' view; this
module carries it out and never decides.
A stream that has to wait gets its 200 at once and hears its place in line. A waiter
leaves the line at once when its client leaves (its handler is cancelled and the ticket
withdrawn), when the gateway starts draining, when its backend fails, or, on a steering
route, the moment a fallback slot frees for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from policies.config import FallbackWhen, Overflow, RouteConfig, RouteFallbackConfig
from policies.scheduler import pipeline
from policies.scheduler.admission import RejectReason
from policies.scheduler.decision import Decision, Refuse
from policies.slots import Lease, QueueShed, QueueTimeout, SlotPool, Ticket
from policies.slots.handover import MoveOffers
from router.candidates import Candidates
from router.common.record import Phase
from router.exchange import Capable, Exchange
from router.request import objective
from router.request.waits import Interrupt, abandon
from router.upstream.client_stream import ClientGone
from router.upstream.health import BackendOpened

_ADMIT_ATTEMPTS = 3  # a snapshot can go stale only with a shared (Redis) pool
_NEVER = RouteFallbackConfig(when=FallbackWhen.NEVER)


async def admit(ex: Exchange, route: RouteConfig, able: Capable,
                gone: Sequence[str] = ()) -> Lease:
    """A slot for the request on `route` (less the backends `gone`), where the scheduler
    says: at once, or after a wait in a line. A batch line runs on the route's primary
    only, in a free slot: the classifier never moves it, no overflow does, and it never
    waits in an interactive line (refused, it waits again in its job's)."""
    if ex.batch:
        route = RouteConfig(primary=route.primary, fallback=_NEVER, overflow=Overflow.REJECT)
    for _ in range(_ADMIT_ATTEMPTS):
        view = Candidates(ex, able)
        lease = await carry_out(ex, pipeline.decide(view, view, route, gone))
        if lease is not None:
            return lease
    pools = [ex.gw.backends[name].pool for name in (route.primary, *route.fallbacks)]
    raise ex.rejection(RejectReason.QUEUE_FULL, ex.retry_after(pools), route.primary)


async def carry_out(ex: Exchange, decision: Decision) -> Lease | None:
    """Do what the scheduler decided: refuse; or take a free slot (its replica pick's
    first), else a place in line (pinned to a replica while the pick says so; with a
    fallback it may move to meanwhile) and wait. None: the line was full meanwhile (a
    shared pool's snapshot gone stale): decide again."""
    if isinstance(decision, Refuse):
        raise ex.rejection(decision.reason, decision.retry_in_s, decision.backend,
                           decision.message)
    if decision.probe is not None:  # (no await since the decision: it still holds)
        ex.gw.health.take_probe(decision.probe)
    rec, parsed = ex.rec, ex.request_body
    backend = ex.gw.backends[decision.backend]
    pool = backend.pool
    rec.backend, rec.reason = decision.backend, decision.reason
    hold_s = decision.hold_s
    if not hold_s:  # (a shared pool may have freed one since its snapshot)
        lease = await pool.try_acquire(decision.prefer, ex.fair_share(backend))
        if lease is not None:
            objective.predict(rec, backend, 0.0, parsed.max_tokens)
            if ex.batch:
                ex.gw.batch_lines.hold(pool.name, ex.request.task, lease)
            return lease
    if ex.batch:
        raise ex.rejection(RejectReason.QUEUE_FULL, ex.retry_after([pool]), pool.name)
    given = ex.gw.batch_lines.count(pool.name)  # past a full line: their slots come to it
    ticket = await pool.enqueue(ex.priority, decision.want, parsed.max_tokens, ex.share(),
                                hold_s, given)
    if ticket is None:
        return None
    ex.gw.batch_lines.preempt(pool.name)  # a batch line holding a slot here gives it up
    objective.predict(rec, backend, ticket.eta_s(), parsed.max_tokens)
    return await wait(ex, pool, ticket, decision.movable)


async def wait(ex: Exchange, pool: SlotPool, ticket: Ticket, movable: str | None) -> Lease:
    """Wait in `pool`'s line with `ticket` (or move to the fallback `movable`)."""
    rec, backend = ex.rec, ex.gw.backends[pool.name]
    rec.phase = Phase.QUEUED
    queued_at = time.perf_counter()
    if ex.trace is not None:
        ex.trace.queued(pool.name, ticket.position, queued_at)
    outcome = "left"  # its client, a drain or its backend's breaker took it out of line
    reporter = None
    if ex.request_body.stream:
        try:
            if ex.response is None:  # a retry that queues again keeps its response
                await ex.open_stream()
            assert ex.response is not None
            await backend.reporter.listen(ex.request, ex.response, ticket,
                                          ex.wants_events(),
                                          ex.config.server.queue_heartbeat_s, ex.dialect)
        except BaseException as exc:
            await ticket.withdraw()
            if isinstance(exc, ConnectionResetError):
                raise ClientGone from None
            raise
        reporter = backend.reporter
    timeout = ex.config.backends[pool.name].queue_timeout_s
    if not pool.capacity and pool.cold is not None:  # no replica ready: the warm-up's bound
        timeout = pool.cold.timeout_s
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
        if pool.cold is not None and not pool.capacity:
            raise ex.rejection(RejectReason.WARMUP, pool.cold.warmup_s, pool.name) from None
        raise ex.rejection(RejectReason.QUEUE_TIMEOUT, ex.retry_after([pool]),
                           pool.name) from None
    except QueueShed:
        outcome = "shed"
        raise ex.rejection(RejectReason.SHED, ex.retry_after([pool]), pool.name) from None
    finally:
        if reporter is not None:
            reporter.leave(ticket)  # from here on, only this handler writes its stream
        rec.queue_wait_ms = (time.perf_counter() - queued_at) * 1000
        backend.series.queue_wait.observe(rec.queue_wait_ms / 1000)
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
