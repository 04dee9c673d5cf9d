"""One attempt of a request on its lease's backend and replica: the body sent upstream,
the answer relayed, its progress recorded whatever the way it ends; and, for a slot leased
in Redis, the attempt stopped if the lease is taken away. `router.dispatch` calls it for
each try (a retry before the first byte is a new attempt).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from policies.clock.forecast import Progress
from policies.config import SystemMessages
from policies.scheduler.admission import RejectReason
from policies.scheduler.capabilities import Capability
from policies.slots import Lease
from router.common.record import Phase
from router.exchange import Exchange
from router.placement import prefilled
from router.request import objective
from router.request.usage import bounded_usage, count_tokens
from router.upstream.client_stream import ClientGone
from router.upstream.failures import UpstreamFailure
from router.upstream.forwarding import Forwarding
from router.upstream.proxy import Attempt, forward
from router.upstream.request_body import upstream_body


async def forward_while_held(ex: Exchange, lease: Lease,
                             lost: asyncio.Future[None]) -> web.StreamResponse:
    """Forward, but stop (the engine aborts) if the shared slot is taken away."""
    forwarding = asyncio.ensure_future(forward_on(ex, lease))
    either: set[asyncio.Future[Any]] = {forwarding, lost}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not forwarding.done():
            forwarding.cancel()
            await asyncio.wait({forwarding})  # raises only a cancellation of our own
        if forwarding.done() and not forwarding.cancelled():  # may end in ClientGone: retrieved
            forwarding.exception()
    if not forwarding.cancelled():
        return forwarding.result()
    raise ex.rejection(RejectReason.SLOT_LOST, 0, lease.pool)


def first_byte(ex: Exchange, lease: Lease) -> Callable[[float], None]:
    """What the attempt's first byte tells: the request's time to first token (its
    objective judged) and, on a group, that its replica now holds its prompt."""
    rec, metrics = ex.rec, ex.gw.metrics
    backend = ex.gw.backends[lease.pool]
    if not backend.grouped or ex.place is None:  # (a retry off a group onto one endpoint)
        return lambda at: objective.first_token(rec, metrics, at)

    def came(at: float) -> None:
        objective.first_token(rec, metrics, at)
        prefilled(backend, lease.replica, ex.place)
    return came


def start_frame(ex: Exchange, backend: str) -> bytes:
    """What a stream hears when its slot is granted (built only for a stream that will)."""
    rec = ex.rec
    return ex.dialect.start_frame(backend, rec.reason, rec.queue_wait_ms, ex.wants_events(),
                                  rec.replica)


async def forward_on(ex: Exchange, lease: Lease) -> web.StreamResponse:
    """One attempt on `lease`'s replica, its progress recorded whatever the way it ends."""
    rec, parsed, name = ex.rec, ex.request_body, lease.pool
    upstream = ex.gw.backends[name].replicas[lease.replica].upstream
    preamble = b""
    tracing, context = ex.trace, None
    if tracing is not None:  # the attempt's span: the engine gets it as its traceparent
        where = upstream.target(parsed.endpoint.value.removeprefix("/v1"))
        context = tracing.attempt(name, lease.replica, where.host, where.port,
                                  upstream.config.model)
    if ex.response is not None:  # (a stream that waited: its answer began meanwhile)
        await ex.send(start_frame(ex, name))
    elif parsed.stream and ex.wants_events():
        preamble = start_frame(ex, name)  # said right after the headers, before the first chunk
    fold = upstream.config.system_messages is SystemMessages.FOLD
    body = (upstream_body(parsed, upstream.config.model, fold) if not ex.big else  # its dump
            await ex.gw.big_bodies.off_loop(upstream_body, parsed, upstream.config.model, fold))
    shadows = ex.gw.shadows  # (None unless a route compares downgrades: moved requests)
    capture = (None if shadows is None or rec.backend == rec.primary
               else shadows.sample(rec, parsed.endpoint))
    attempt = Attempt(
        ex.request, upstream, parsed.endpoint, body, parsed.stream,
        strip_usage=parsed.stream and not parsed.wants_usage,
        request_id=rec.request_id, headers=ex.headers(),
        max_response_bytes=ex.config.server.max_response_bytes,
        rules=Forwarding.of(ex.config.server), preamble=preamble, response=ex.response,
        on_first_byte=(lambda at: objective.first_token(rec, ex.gw.metrics, at))
        if ex.place is None else first_byte(ex, lease),  # (a group's pick made a place)
        translation=ex.dialect.translation(parsed, rec.request_id), trace=context,
        usage=bounded_usage(ex.prompt_tokens(), parsed.max_tokens,
                            Capability.VISION in ex.needs().capabilities,
                            upstream.config.context_window), capture=capture)
    # The forecast reads the relay's event count (a stream's); nothing more per event.
    lease.follow(Progress(parsed.max_tokens, attempt.usage if parsed.stream else None))
    failed: str | None = None  # how the attempt failed, for its span
    try:
        response = await forward(attempt)
        rec.phase = Phase.DONE
        return response
    except UpstreamFailure as failure:
        failed = failure.kind.value
        raise
    except (ClientGone, ConnectionResetError, asyncio.CancelledError):
        failed = "client_disconnected" if not ex.gw.cutting else "shutdown"
        raise
    finally:
        if tracing is not None:
            tracing.attempted(attempt.status, failed)
        ex.response = attempt.response
        if attempt.streaming and rec.phase is not Phase.DONE:
            rec.phase = Phase.STREAMING
        if attempt.status == 200:  # the backend took the request and began to answer
            count_tokens(rec, parsed, attempt.usage)
            if capture is not None and rec.phase is Phase.DONE:
                shadows.keep(rec, parsed.endpoint, parsed.body, capture)  # type: ignore[union-attr]
            if attempt.usage.rejected:
                ex.gw.metrics.usage_rejected(name)
