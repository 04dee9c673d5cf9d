"""One request's life: parse -> route -> admit -> (wait) -> forward -> release -> record.

The decisions come from `policies`; this module carries them out. The slot lease is
released in `finally` on every path, and a client that leaves while queued leaves
the queue at once (its handler is cancelled and the ticket withdrawn).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Sequence
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from classifier.text import request_text
from policies.admission import Decision, Reject, RejectReason, Wait, decide
from policies.config import Config, FallbackWhen, Priority, RouteConfig
from policies.eta import advised_retry_s
from policies.failures import FailureKind
from policies.fallback import Candidate, Move, RequestFacts, Stay, estimate_tokens
from policies.fallback import decide as steer
from policies.slots import (
    Lease,
    PoolSnapshot,
    PoolUnavailable,
    QueueShed,
    QueueTimeout,
    SlotPool,
    Ticket,
)
from policies.slots.handover import MoveOffers
from router.gateway import GATEWAY, Gateway
from router.openai_api import (
    ApiError,
    Endpoint,
    ParsedRequest,
    check_content_encoding,
    check_content_type,
    parse_request,
    read_body,
    upstream_body,
)
from router.record import Phase, RequestRecord, key_id, new_id, request_id, subject
from router.request.access_log import log_refused
from router.request.body import BodyHold
from router.request.rejections import rejection
from router.request.usage import CLIENT_CLOSED, count_tokens
from router.request.waits import Interrupt, abandon
from router.sse import SSE_HEADERS, Usage, start_frame
from router.upstream.failures import UpstreamFailure
from router.upstream.forwarding import Forwarding
from router.upstream.health import BackendOpened, parse_retry_after, retryable
from router.upstream.proxy import ClientGone, Relay, drain_if_abandoned, forward

log = logging.getLogger("slotgate.access")
errors = logging.getLogger("slotgate.error")
_ADMIT_ATTEMPTS = 3  # a snapshot can go stale only with a shared (Redis) pool


def _may_steer(route: RouteConfig, decision: Decision) -> bool:
    """The classifier runs only where its answer can change the outcome."""
    when = route.fallback.when
    return when is FallbackWhen.ALWAYS or (
        when is FallbackWhen.SATURATED and isinstance(decision, Wait)
    )


async def handle(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    config = gw.config  # one config for the whole request, whatever a reload does meanwhile
    own = new_id()
    rec = RequestRecord(request_id(request, own), endpoint.value, time.perf_counter(),
                        time.time(), own,
                        tenant=None if gw.keyring.enabled else key_id(request))
    exchange = Exchange(request, gw, rec, config)
    failed: FailureKind | None = None  # how the upstream exchange failed, if it did
    gw.enter(request.task)
    try:
        if gw.draining:
            raise exchange.rejection(RejectReason.DRAINING, config.server.retry_after_min_s,
                                     None)
        if (caller := gw.keyring.caller(request)) is not None:  # 401 for a wrong key
            rec.tenant, rec.key_id = caller.tenant, caller.key_id
        exchange.priority = gw.keyring.priority(caller, request)
        rec.priority = exchange.priority.value
        check_content_type(request)
        check_content_encoding(request)
        if caller is not None:  # the key's own limits, checked before its body is read
            if (refusal := gw.quotas.admit(caller.key_id)) is not None:
                raise exchange.rejection(refusal.reason, refusal.advised_retry_s, None,
                                         refusal.message)
            rec.quota_held = True
        server = config.server
        raw = await read_body(request, server.max_body_bytes, server.body_read_timeout_s,
                              exchange.hold)
        parsed = exchange.parsed = parse_request(raw, endpoint, config.server)
        rec.stream = parsed.stream
        route = config.routes.get(parsed.model)
        if route is None:
            raise ApiError(404, f"The model '{parsed.model}' does not exist.",
                           code="model_not_found", param="model")
        window = config.backends[route.primary].context_window
        if parsed.max_tokens is not None and window is not None and parsed.max_tokens > window:
            raise ApiError(400, f"max_tokens ({parsed.max_tokens}) exceeds the model's context "
                           f"window of {window} tokens.", code="context_length_exceeded",
                           param="max_tokens")
        rec.route, rec.primary = parsed.model, route.primary
        experiment = gw.experiments.get(parsed.model)
        if experiment is not None:
            key = caller.key_id if caller is not None else rec.tenant
            arm = experiment.assign(subject(parsed, key, request))
            rec.experiment, rec.arm, route = arm.experiment, arm.name, arm.route
        try:
            response = await exchange.run(parsed, route)
        except PoolUnavailable as exc:
            raise exchange.rejection(RejectReason.UNAVAILABLE, math.ceil(exc.retry_after_s),
                                     rec.backend or route.primary) from None
        rec.status = response.status
        return response
    except UpstreamFailure as failure:  # the response edge: the client's OpenAI-shaped error
        failed = failure.kind
        err = failure.api_error()
        rec.status, rec.error = err.status, err.code
        return await exchange.fail(err)
    except ApiError as err:
        rec.status, rec.error = err.status, err.code
        return await exchange.fail(err)
    except (ClientGone, ConnectionResetError):
        rec.disconnect, rec.status = rec.phase, CLIENT_CLOSED
        return exchange.response or web.Response(status=CLIENT_CLOSED)
    except asyncio.CancelledError:
        if not gw.cutting:
            rec.disconnect, rec.status = rec.phase, CLIENT_CLOSED
            raise
        # Shutdown cut it, not its client: say so (in-band once a stream has begun).
        cut = ApiError(503, "The gateway shut down before this answer was complete; retry.",
                       "server_error", "shutdown")
        rec.status, rec.error = cut.status, cut.code
        if exchange.response is not None:
            await exchange.fail(cut)
        raise
    except HttpProcessingError:  # a body aiohttp could not decode (bad chunking, short)
        bad = ApiError(400, "The request body could not be read (malformed framing).",
                       code="invalid_body")
        rec.status, rec.error = bad.status, bad.code
        return await exchange.fail(bad)
    except Exception:
        # A bug of ours: its traceback logged here, once; the client gets a 500 in
        # OpenAI's shape, and the status is counted like any other (metrics, log, ledger).
        errors.exception("internal error on %s (request %s)", endpoint.value, rec.request_id)
        bug = ApiError(500, "The gateway failed on this request (an internal error, "
                       "logged); retry.", "server_error", "internal_error")
        rec.status, rec.error = bug.status, bug.code
        return await exchange.fail(bug)
    finally:
        exchange.hold.release()
        gw.leave(request.task)
        rec.total_ms = (time.perf_counter() - rec.started_at) * 1000
        gw.record(rec, failed)
        logs = config.logging
        if logs.access and log.isEnabledFor(logging.INFO):
            if gw.keyring.enabled and rec.key_id is None:  # refused before the caller was known
                log_refused(log, gw.refusals, rec, logs.refusal_interval_s)
            elif logs.content and exchange.parsed is not None:  # the operator asked for it
                line = {**orjson.loads(orjson.dumps(rec)),
                        "prompt": request_text(exchange.parsed.body)}
                log.info(orjson.dumps(line).decode())
            else:
                log.info(orjson.dumps(rec).decode())


class Exchange:
    """The state of one request while it is admitted, queued and forwarded."""

    __slots__ = ("config", "facts", "gw", "hold", "parsed", "priority", "rec", "request",
                 "response")

    def __init__(self, request: web.Request, gw: Gateway, rec: RequestRecord,
                 config: Config) -> None:
        self.request = request
        self.gw = gw
        self.config = config
        self.rec = rec
        self.response: web.StreamResponse | None = None  # set once SSE headers went out
        self.facts: RequestFacts | None = None  # the classifier's verdict, made at most once
        self.parsed: ParsedRequest | None = None
        self.priority = Priority.STANDARD
        self.hold = BodyHold(gw.bodies, config.server.max_inflight_body_bytes,
                             gw.bodies_full)

    async def run(self, parsed: ParsedRequest, route: RouteConfig) -> web.StreamResponse:
        health, retry_min = self.gw.health, self.config.server.retry_after_min_s
        chain = [route.primary, *route.fallbacks]
        while True:
            if health.is_open(route.primary):  # a sick primary takes no new work
                route = health.around(route, chain, retry_min)
            try:
                lease = await self.admit(parsed, route)
                break
            except BackendOpened as opened:  # its breaker opened while we queued: on to
                rest = health.without(route, opened.args[0])  # the rest of the route
                if rest is None:
                    raise health.unavailable(opened.args[0], chain, retry_min) from None
                route = rest
        while True:
            try:
                return await self.serve(parsed, lease)
            except UpstreamFailure as failure:
                # Retry on the route's next backend before the first byte, within budget,
                # unless the request itself caused the failure (it would walk the route).
                if not retryable(failure) or self.rec.phase is not Phase.BEFORE_FIRST_BYTE:
                    raise
                later = chain[chain.index(lease.pool) + 1:] if lease.pool in chain else []
                after = next((b for b in later if health.allows(b)), None)
                if after is None or not health.may_retry(self.gw.running):
                    raise
            health.retrying += 1
            try:
                self.rec.reason = f"retry:{lease.pool}"
                lease = await self.admit_to(parsed, after)
            except BackendOpened:
                raise health.unavailable(after, chain, retry_min) from None
            finally:
                health.retrying -= 1

    async def serve(self, parsed: ParsedRequest, lease: Lease) -> web.StreamResponse:
        """Forward on `lease`'s backend; the slot is released on every path."""
        self.rec.slot_at = time.perf_counter()
        self.rec.backend = lease.pool
        try:
            self.rec.phase = Phase.BEFORE_FIRST_BYTE
            lost = lease.lost()
            if lost is None:
                response = await self.forward(parsed, lease.pool)
            else:
                response = await self.forward_while_held(parsed, lease.pool, lost)
            self.gw.health.succeeded(lease.pool)
            return response
        except UpstreamFailure as failure:
            # The engine's faults only; an unsure one waits for the backend's health check
            # with the slot held, so that a failing engine's queue moves before it frees.
            await self.gw.health.report(lease.pool, failure)
            if failure.kind is FailureKind.UPSTREAM_429:  # its own backpressure: honour
                self.gw.health.throttle(  # its Retry-After
                    lease.pool, parse_retry_after(failure.headers.get("Retry-After")))
            raise
        finally:
            held_s = lease.held_s
            self.rec.slot_ms = held_s * 1000
            self.gw.metrics.held(lease.pool, held_s)
            await lease.release()

    async def admit_to(self, parsed: ParsedRequest, backend: str) -> Lease:
        """A slot on one given backend (a retry): free now, or after waiting in its line."""
        pool = self.gw.pools[backend]
        self.rec.backend = backend
        lease = await pool.try_acquire()
        if lease is not None:
            return lease
        ticket = await pool.enqueue(self.priority)
        if ticket is None:
            raise self.rejection(RejectReason.QUEUE_FULL, self.retry_after([pool]), backend)
        return await self.wait(parsed, pool, ticket, None)

    async def admit(self, parsed: ParsedRequest, route: RouteConfig) -> Lease:
        """Route -> admit -> (steer to a fallback) -> take a slot or a place in line."""
        gw, rec = self.gw, self.rec
        server = self.config.server
        primary = gw.pools[route.primary]
        fallbacks = [gw.pools[name] for name in route.fallbacks]
        for _ in range(_ADMIT_ATTEMPTS):
            decision = decide(
                primary.snapshot(), [p.snapshot() for p in fallbacks], route.overflow,
                server.retry_after_min_s, server.retry_after_max_s, self.priority,
                forecast=self.next_slot_s,
            )
            if isinstance(decision, Reject):
                raise self.rejection(decision.reason, decision.advised_retry_s, primary.name)
            target, reason, movable = decision.pool, decision.reason.value, None
            if target == primary.name and _may_steer(route, decision):
                step = self.steer(parsed, route)
                if isinstance(step, Move):
                    target, reason = step.pool, step.reason
                elif step.movable:
                    movable = step.movable[0]
            pool = gw.pools[target]
            rec.backend, rec.reason = target, reason
            lease = await pool.try_acquire()
            if lease is not None:
                return lease
            ticket = await pool.enqueue(self.priority)
            if ticket is not None:
                return await self.wait(parsed, pool, ticket, movable)
        raise self.rejection(RejectReason.QUEUE_FULL, server.retry_after_min_s, primary.name)

    async def forward_while_held(self, parsed: ParsedRequest, backend: str,
                                 lost: asyncio.Future[None]) -> web.StreamResponse:
        """Forward, but stop (the engine aborts) if the shared slot is taken away."""
        forwarding = asyncio.ensure_future(self.forward(parsed, backend))
        either: set[asyncio.Future[Any]] = {forwarding, lost}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not forwarding.done():
                forwarding.cancel()
                await asyncio.wait({forwarding})  # raises only a cancellation of our own
        if not forwarding.cancelled():
            return forwarding.result()
        err = ApiError(503, "This request's slot lease was lost (the gateway could not renew "
                       "it in Redis within its TTL); retry.", "server_error", "slot_lost")
        err.headers["Retry-After"] = str(self.config.server.retry_after_min_s)
        raise err

    def steer(self, parsed: ParsedRequest, route: RouteConfig) -> Move | Stay:
        """Classify once, then ask the fallback policy whether to leave the primary."""
        gw, rec = self.gw, self.rec
        if self.facts is None:
            assert gw.classifier is not None, "steering routes load the classifier at startup"
            began = time.perf_counter()
            prediction = gw.classifier.predict(request_text(parsed.body))
            gw.metrics.classifier.observe(time.perf_counter() - began)
            self.facts = RequestFacts(
                prediction.intent, prediction.p_simple(route.fallback.intents),
                estimate_tokens(len(parsed.raw.decode(errors="replace")), len(parsed.raw)),
                parsed.max_tokens,
            )
            rec.intent, rec.p_simple = self.facts.intent, round(self.facts.p_simple, 4)
        candidates = [
            Candidate(gw.pools[name].snapshot(), self.config.backends[name].context_window)
            for name in route.fallbacks
        ]
        return steer(self.facts, gw.pools[route.primary].snapshot(), candidates, route.fallback)

    async def wait(self, parsed: ParsedRequest, pool: SlotPool, ticket: Ticket,
                   movable: str | None) -> Lease:
        rec = self.rec
        rec.phase = Phase.QUEUED
        queued_at = time.perf_counter()
        reporter = None
        if parsed.stream:
            try:
                if self.response is None:  # a retry that queues again keeps its response
                    await self.open_stream()
                assert self.response is not None
                await self.gw.reporters[pool.name].listen(
                    self.request, self.response, ticket, self.wants_events(parsed),
                    self.config.server.queue_heartbeat_s)
            except BaseException as exc:
                await ticket.withdraw()
                if isinstance(exc, ConnectionResetError):
                    raise ClientGone from None
                raise
            reporter = self.gw.reporters[pool.name]
        timeout = self.config.backends[pool.name].queue_timeout_s
        try:
            if movable is None:
                waiting = ticket.wait(timeout)
            else:
                waiting = self.wait_or_move(ticket, timeout, self.gw.offers[movable])
            lease = await self.unless_draining(waiting, pool.name)
        except QueueTimeout:
            raise self.rejection(RejectReason.QUEUE_TIMEOUT, self.retry_after([pool]),
                                 pool.name) from None
        except QueueShed:
            raise self.rejection(RejectReason.SHED, self.retry_after([pool]), pool.name) from None
        finally:
            if reporter is not None:
                reporter.leave(ticket)  # from here on, only this handler writes its stream
            rec.queue_wait_ms = (time.perf_counter() - queued_at) * 1000
            self.gw.metrics.queue_wait.labels(pool.name).observe(rec.queue_wait_ms / 1000)
        return lease

    async def unless_draining(self, waiting: Awaitable[Lease], pool: str) -> Lease:
        """A slot from `waiting`, unless the gateway starts draining first (the request
        leaves the line, passing on any slot it got, and is answered 503) or the pool's
        backend fails meanwhile (it leaves the line: `BackendOpened`).

        Either signal cancels this handler's own wait, as a client leaving does (no task
        or `asyncio.wait` per waiter: thousands may queue); the wait then withdraws."""
        cut = Interrupt(self.request.task)
        drain, opened = self.gw.drain_signal(), self.gw.health.opened(pool)
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
        raise self.rejection(RejectReason.DRAINING, self.config.server.retry_after_min_s, pool)

    async def wait_or_move(self, ticket: Ticket, limit_s: float, offers: MoveOffers) -> Lease:
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
        assert self.facts is not None
        self.rec.backend = offers.pool.name
        self.rec.reason = f"fallback:simple:{self.facts.intent}:{self.facts.p_simple:.2f}"
        return offer.result()

    async def open_stream(self) -> None:
        """A stream that must wait gets its 200 and SSE headers at once."""
        response = web.StreamResponse(status=200, headers={**SSE_HEADERS, **self.headers()})
        self.response = response
        try:
            await response.prepare(self.request)
        except ConnectionResetError:
            raise ClientGone from None

    def wants_events(self, parsed: ParsedRequest) -> bool:
        header = self.request.headers.get("X-Slotgate-Queue-Events", "")
        return parsed.queue_events or header.lower() in ("true", "1", "yes")

    async def forward(self, parsed: ParsedRequest, backend: str) -> web.StreamResponse:
        gw, rec = self.gw, self.rec
        upstream = gw.upstreams[backend]
        body = upstream_body(parsed, upstream.config.model)
        start = start_frame(backend, rec.reason, rec.queue_wait_ms, self.wants_events(parsed))
        preamble = b""
        if self.response is not None:
            await self._send(start)
        elif parsed.stream and self.wants_events(parsed):
            preamble = start  # said right after the headers, before the first chunk
        relay = Relay(Usage())
        try:
            response = await drain_if_abandoned(upstream, parsed.stream, forward(
                self.request, upstream, parsed.endpoint, body, parsed.stream,
                strip_usage=parsed.stream and not parsed.wants_usage,
                request_id=rec.request_id, response=self.response,
                extra_headers=self.headers(),
                max_response_bytes=self.config.server.max_response_bytes, relay=relay,
                preamble=preamble, rules=Forwarding.of(self.config.server),
            ))
            rec.phase = Phase.DONE
            return response
        finally:
            if relay.response is not None:
                self.response = relay.response
            if relay.streaming and rec.phase is not Phase.DONE:
                rec.phase = Phase.STREAMING
            if relay.first_byte_at is not None:
                rec.ttft_ms = (relay.first_byte_at - rec.started_at) * 1000
            if relay.status == 200:  # the backend took the request and began to answer
                count_tokens(rec, parsed, relay.usage)

    def headers(self) -> dict[str, str]:
        rec = self.rec
        out = {"x-request-id": rec.request_id}
        if rec.backend:
            out["x-slotgate-backend"] = rec.backend
            out["x-slotgate-route-reason"] = rec.reason or ""
            if rec.phase is not Phase.QUEUED:
                out["x-slotgate-queue-wait-ms"] = f"{rec.queue_wait_ms:.0f}"
        if rec.arm is not None and rec.experiment is not None:
            out["x-slotgate-experiment"] = rec.experiment
            out["x-slotgate-arm"] = rec.arm
        return out

    def next_slot_s(self, pool: PoolSnapshot) -> float:
        """The pool's own forecast of seconds until its next slot frees."""
        return self.gw.pools[pool.name].forecast(1)

    def retry_after(self, pools: Sequence[SlotPool]) -> int:
        """The Retry-After of a request refused by `pools` (its queue full, its wait over):
        the same forecast and bounds as an admission's `Reject`."""
        server = self.config.server
        return advised_retry_s((pool.forecast(1) for pool in pools),
                               server.retry_after_min_s, server.retry_after_max_s)

    def rejection(self, reason: RejectReason, retry_s: int, backend: str | None,
                  message: str | None = None) -> ApiError:
        return rejection(self.gw.metrics, reason, retry_s, backend, message)

    async def fail(self, err: ApiError) -> web.StreamResponse:
        err.headers.update(self.headers())
        if self.response is None:
            return err.response()
        with contextlib.suppress(ClientGone, ConnectionResetError):  # 200 sent: say it in-band
            await self._send(err.sse_event())
            await self.response.write_eof()
        return self.response

    async def _send(self, data: bytes) -> None:
        assert self.response is not None
        try:
            await self.response.write(data)
        except ConnectionResetError:
            raise ClientGone from None
