"""One request's life: parse -> route -> admit -> (wait) -> forward -> release -> record.

The decisions come from `policies`; this module carries them out, with the wait for a
slot in `router.waiting`, each attempt on a slot in `router.attempt` and the request's
state in `router.exchange`. The slot lease is
released in `finally` on every path; a failure before the first byte may be retried on
the route's next backend; every request, whatever its end, is accounted for once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from classifier.text import request_text
from policies.apis import GENERATIVE_APIS, Api
from policies.config import (
    Config,
    FallbackWhen,
    RouteConfig,
    RouteFallbackConfig,
)
from policies.health.breaker import Blame
from policies.health.failures import FailureKind
from policies.scheduler import pipeline
from policies.scheduler.admission import RejectReason
from policies.slots import Lease, PoolUnavailable
from router.apis.anthropic import ANTHROPIC
from router.apis.dialect import OPENAI, Dialect
from router.apis.responses import dialect_for
from router.attempt import forward_on, forward_while_held
from router.candidates import Candidates
from router.common.errors import ApiError
from router.common.parsed import Endpoint, ParsedRequest
from router.common.record import Phase, RequestRecord, key_id, new_id, request_id, subject
from router.exchange import Exchange
from router.gateway import GATEWAY
from router.placement import placed, unplaced
from router.request import objective, quota
from router.request.access_log import log_refused
from router.request.accounting import answered, settle
from router.request.big_body import BIG_BODY
from router.request.intake import check_content_encoding, check_content_type, read_body
from router.request.usage import CLIENT_CLOSED
from router.telemetry.logs import access
from router.upstream.client_stream import ClientGone
from router.upstream.failures import UpstreamFailure
from router.upstream.health import BackendOpened, blame, parse_retry_after, retryable
from router.waiting import admit, carry_out

log = logging.getLogger("slotgate.access")
errors = logging.getLogger("slotgate.error")
# The wire dialect of each endpoint that does not speak OpenAI's own (router.apis.dialect).
DIALECTS: dict[Endpoint, Dialect] = {Endpoint.MESSAGES: ANTHROPIC}


def parse_body(raw: bytes, endpoint: Endpoint, dialect: Dialect, config: Config
               ) -> tuple[Dialect, ParsedRequest]:
    """The request in `raw` and the dialect that read it (Responses: passed through, or
    translated to chat). Pure: it may run off the loop."""
    if endpoint is Endpoint.RESPONSES:
        dialect = dialect_for(raw, config)
    return dialect, dialect.parse(raw, endpoint, config.server)


async def handle(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    config = gw.config  # one config for the whole request, whatever a reload does meanwhile
    own = new_id()
    # (`_value_`: an enum's value without the two calls of its `.value` descriptor)
    rec = RequestRecord(request_id(request, own), endpoint._value_, time.perf_counter(),
                        time.time(), own, endpoint.api._value_,
                        tenant=None if gw.keyring.enabled else key_id(request))
    exchange = Exchange(request, gw, rec, config, DIALECTS.get(endpoint, OPENAI))
    if gw.tracer is not None:
        exchange.trace = gw.tracer.begin(request, rec)
    gw.handlers.add(request.task)  # left in `closed` (Gateway.leave)
    try:
        return await admitted(exchange, endpoint)
    except UpstreamFailure as failure:  # the response edge: the client's OpenAI-shaped error
        exchange.failed = failure.kind
        err = failure.api_error()
        rec.status, rec.error = err.status, err.code
        return await exchange.fail(err)
    except ApiError as err:
        refused(rec, err, exchange.parsed, config.routes)
        return await exchange.fail(err)
    except (ClientGone, ConnectionResetError):
        rec.disconnect, rec.status = rec.phase, CLIENT_CLOSED
        return exchange.response or web.Response(status=CLIENT_CLOSED)
    except asyncio.CancelledError:
        if not gw.cutting:
            rec.disconnect, rec.status = rec.phase, CLIENT_CLOSED
            raise
        # Shutdown cut it, not its client: say so (in-band once a stream has begun).
        cut = exchange.rejection(RejectReason.SHUTDOWN, 0, rec.backend)
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
        closed(exchange)


async def admitted(exchange: Exchange, endpoint: Endpoint) -> web.StreamResponse:
    """The request let in (its key, its body, its route: 404 for no such model, 400 for a
    max_tokens beyond the primary's window; its limits) and run."""
    gw, rec, config, request = exchange.gw, exchange.rec, exchange.config, exchange.request
    if gw.draining:
        raise exchange.rejection(RejectReason.DRAINING, 0, None)
    if (caller := gw.keyring.caller(request)) is not None:  # 401 for a wrong key
        # (auth off: a batch line's key id is "", recorded as none)
        rec.tenant, rec.key_id, rec.batch = caller.tenant, caller.key_id or None, caller.batch
        exchange.weight, exchange.batch = caller.weight, caller.batch
    exchange.priority = gw.keyring.priority(caller, request)
    rec.priority = exchange.priority._value_
    check_content_type(request)
    check_content_encoding(request)
    limited = caller.key_id if caller is not None and caller.key_id in gw.quotas.limits \
        else None
    if limited is not None:  # a limited key: refused before its body, if it is
        quota.precheck(exchange, limited)
    server = config.server
    raw = await read_body(request, server.max_body_bytes, server.body_read_timeout_s,
                          exchange.hold)
    if len(raw) < BIG_BODY:
        dialect, parsed = parse_body(raw, endpoint, exchange.dialect, config)
    else:  # off the loop (router.request.big_body)
        exchange.big = True
        dialect, parsed = await gw.big_bodies.parse(parse_body, raw, endpoint,
                                                    exchange.dialect, config)
    exchange.dialect, exchange.parsed = dialect, parsed
    rec.stream, rec.dropped_tools = parsed.stream, parsed.dropped_tools
    route = config.routes.get(parsed.model)
    if route is None:
        raise ApiError(404, f"The model '{parsed.model}' does not exist.",
                       code="model_not_found", param="model")
    # A translated API is served by the engines' own (Messages: chat completions).
    route = fitted(route, parsed.endpoint, config.backends[route.primary].served_apis,
                   parsed.model, endpoint)
    window = config.backends[route.primary].context_window
    if parsed.max_tokens is not None and window is not None and parsed.max_tokens > window:
        raise ApiError(400, f"max_tokens ({parsed.max_tokens}) exceeds the model's context "
                       f"window of {window} tokens.", code="context_length_exceeded",
                       param="max_tokens")
    rec.route, rec.primary = parsed.model, route.primary
    experiment = gw.experiments.get(parsed.model)
    if experiment is not None and not exchange.batch:  # (batch work runs as configured)
        key = caller.key_id if caller is not None else rec.tenant
        arm = experiment.assign(subject(parsed, key, request))
        rec.experiment, rec.arm, route = arm.experiment, arm.name, arm.route
    objective.assign(rec, config, route, exchange.priority)
    if limited is not None:
        await quota.reserve(exchange, limited, route)
    try:
        response = await run(exchange, route)
    except PoolUnavailable as exc:
        raise exchange.rejection(RejectReason.UNAVAILABLE, exc.retry_after_s,
                                 rec.backend or route.primary) from None
    rec.status = response.status
    return response


def closed(exchange: Exchange) -> None:
    """Whatever way the request ended: its body bound given back, its record settled
    (metrics, quota, ledger, trace) and written (the access line, sampled for refusals)."""
    gw, rec, config = exchange.gw, exchange.rec, exchange.config
    exchange.hold.release()
    if exchange.big:
        gw.big_bodies.ended()
    gw.leave(exchange.request.task)
    rec.total_ms = (time.perf_counter() - rec.started_at) * 1000
    if rec.slo_ttft_ms is not None:  # an objective applied: judged now if not yet
        objective.settle(rec, gw.metrics)
    logs = config.logging
    left_out = (0 if rec.status < 400 or rec.key_id is None  # None: not written
                else gw.key_refusals.admit(rec, logs.refusals_per_key_s))
    settle(gw, rec, gw.keyring.enabled, exchange.failed, exchange.quota, left_out is not None)
    if exchange.trace is not None:
        exchange.trace.end(rec, None if exchange.parsed is None
                           else exchange.parsed.max_tokens)
    if logs.access and left_out is not None and log.isEnabledFor(logging.INFO):
        if gw.keyring.enabled and rec.key_id is None:  # refused before the caller was known
            log_refused(log, gw.refusals, rec, logs.refusal_interval_s)
        elif left_out:  # a key's refusals left out before this one
            log.info(orjson.dumps({**orjson.loads(orjson.dumps(rec)),
                                   "suppressed": left_out}).decode())
        elif logs.content and exchange.parsed is not None:  # the operator asked for it
            line = {**orjson.loads(orjson.dumps(rec)),
                    "prompt": request_text(exchange.parsed.body)}
            log.info(orjson.dumps(line).decode())
        else:
            access(orjson.dumps(rec).decode())


def fitted(route: RouteConfig, endpoint: Endpoint, served: frozenset[Api],
           model: str, asked: Endpoint | None = None) -> RouteConfig:
    """The route as a request sent upstream on `endpoint` runs it (`asked`: the endpoint
    the client called, when it was translated): refused when its primary does not serve
    that API (`served`); never steered by intent when the API carries no text the
    classifier reads (embeddings): overflow alone may use the fallbacks."""
    api = endpoint.api
    if api not in served:
        raise ApiError(400, f"The model '{model}' does not serve {(asked or endpoint).value} "
                       f"(it serves: {', '.join(sorted(served))}).", code="unsupported_api",
                       param="model")
    if api in GENERATIVE_APIS or route.fallback.when is FallbackWhen.NEVER:
        return route
    return route.model_copy(update={"fallback": _NEVER})


_NEVER = RouteFallbackConfig(when=FallbackWhen.NEVER)


async def run(ex: Exchange, route: RouteConfig) -> web.StreamResponse:
    """Admit where the scheduler says, serve, and retry a failure before the first byte
    where it says next (a sibling replica, or the route's next backend)."""
    gw = ex.gw
    chain = [route.primary, *route.fallbacks]
    able = ex.able(route.primary)  # never a backend that cannot serve the request
    gone: list[str] = []  # backends whose breaker opened while it queued there
    while True:
        try:
            lease = await admit(ex, route, able, gone)
            break
        except BackendOpened as opened:  # on to the rest of the route
            gone.append(opened.args[0])
    while True:
        try:
            return await serve(ex, lease)
        except UpstreamFailure as failure:
            # Unless the request itself caused the failure (it would walk the route), or
            # the answer has begun.
            if not retryable(failure) or ex.rec.phase is not Phase.BEFORE_FIRST_BYTE:
                raise
            ex.failed_on.append(lease.replica)
            view = Candidates(ex, able)
            decision = pipeline.retry(view, view, chain, lease.pool, gw.health.retrying,
                                      gw.running, sibling=_sibling(ex, lease))
            if decision is None:
                raise
        gw.health.retrying += 1
        try:
            retried = await carry_out(ex, decision)
        except BackendOpened as opened:
            raise ex.rejection(RejectReason.BACKEND_UNAVAILABLE,
                               gw.health.retry_in_s(chain), opened.args[0],
                               unavailable(opened.args[0])) from None
        finally:
            gw.health.retrying -= 1
        if retried is None:
            raise ex.rejection(RejectReason.QUEUE_FULL,
                               ex.retry_after([gw.backends[ex.rec.backend or ""].pool]),
                               ex.rec.backend)
        lease = retried


def unavailable(name: str) -> str:
    return (f"Backend '{name}' is unavailable and so are its route's fallbacks; "
            "retry later.")


def _sibling(ex: Exchange, lease: Lease) -> bool:
    """Has `lease`'s backend another replica, not yet tried, that takes work?"""
    backend = ex.gw.backends[lease.pool]
    return backend.grouped and any(seat.healthy and seat.name not in ex.failed_on
                                   for seat in backend.pool.seats())


async def serve(ex: Exchange, lease: Lease) -> web.StreamResponse:
    """Forward on `lease`'s backend and replica; the slot is released on every path."""
    rec, parsed = ex.rec, ex.request_body
    rec.slot_at = time.perf_counter()
    name = rec.backend = lease.pool
    rec.replica = lease.replica
    backend = ex.gw.backends[name]
    work = placed(backend, lease, ex.place) if backend.grouped else 0
    try:
        rec.phase = Phase.BEFORE_FIRST_BYTE
        lost = lease.lost()
        if lost is None:
            response = await forward_on(ex, lease)
        else:
            response = await forward_while_held(ex, lease, lost)
        backend.breaker.success()
        if backend.grouped and (breaker := backend.replicas[lease.replica].breaker) is not None:
            breaker.success()  # (a group's replicas each have one)
        return response
    except UpstreamFailure as failure:
        # The engine's faults only: a group's against the replica; an unsure one waits for
        # the backend's health check with the slot held, so that a failing engine's queue
        # moves before it frees.
        if backend.grouped and blame(failure) is Blame.ENGINE:
            ex.gw.replica_health.report(name, lease.replica, failure)
        else:
            await ex.gw.health.report(name, failure)
        if failure.kind is FailureKind.UPSTREAM_429:  # its own backpressure: honour its
            wait_s = parse_retry_after(failure.headers.get("Retry-After"))  # Retry-After
            if not (backend.grouped and ex.gw.replica_health.throttle(
                    name, lease.replica, wait_s)):  # the replica alone, if others serve
                ex.gw.health.throttle(name, wait_s)
        raise
    finally:
        held_s = lease.held_s
        rec.slot_ms = held_s * 1000
        backend.series.held(held_s)
        if work:
            unplaced(backend, lease, work)
        if not ex.batch:  # (batch work, shadows included, is cut at will: no interactive
            backend.clock.observe(answered(  # request waits for it; it teaches nothing)
                rec, held_s, parsed.max_tokens, parsed.endpoint.api in GENERATIVE_APIS),
                rec.replica)  # before the forecasts (a group's replicas learn their own)
        if rec.completion_tokens is not None:  # what a fair line charges its tenant
            lease.charge(rec.completion_tokens)
        await lease.release()


def refused(rec: RequestRecord, err: ApiError, parsed: ParsedRequest | None,
            routes: Mapping[str, RouteConfig]) -> None:
    """A refusal's facts for its log line: its code (the error's type where it has none),
    the field at fault, and the route once the model named one."""
    rec.status, rec.error, rec.param = err.status, err.code or err.type, err.param
    if rec.route is None:
        model = parsed.model if parsed is not None else err.model
        if model is not None and model in routes:
            rec.route = model
