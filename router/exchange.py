"""The state of one request while it is admitted, queued and forwarded, and how it
answers its client: the gateway's headers, rejections, errors (in-band once a stream
has begun) and a stream opened early for a request that has to wait.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from aiohttp import web

from policies.config import Config, Priority, QueueOrder
from policies.health.failures import FailureKind
from policies.limits.quotas import QuotaHold
from policies.scheduler.admission import RejectReason
from policies.scheduler.capabilities import Needs, body_tokens, needs_of, serves
from policies.scheduler.steering import RequestFacts
from policies.slots import Share, SlotPool
from router.apis.dialect import OPENAI, Dialect
from router.backend import Backend
from router.common.errors import ApiError
from router.common.parsed import ParsedRequest
from router.common.record import Phase, RequestRecord
from router.common.sse import SSE_HEADERS
from router.gateway import Gateway
from router.placement import Placement, Preference, placement, preference
from router.request.body import BodyHold
from router.upstream.client_stream import ClientGone

if TYPE_CHECKING:
    from router.tracing.spans import RequestTrace


class Exchange:
    """One request's state, from its head to its record."""

    __slots__ = ("_needs", "_prompt", "batch", "big", "config", "dialect", "facts", "failed",
                 "failed_on", "gw", "hold", "parsed", "place", "priority", "quota", "rec",
                 "request", "response", "trace", "weight")

    def __init__(self, request: web.Request, gw: Gateway, rec: RequestRecord,
                 config: Config, dialect: Dialect = OPENAI) -> None:
        self.request = request
        self.dialect = dialect  # how its answers and errors are spoken
        self.gw = gw
        self.config = config  # one config for the whole request, whatever a reload does
        self.rec = rec
        self.response: web.StreamResponse | None = None  # set once SSE headers went out
        self.facts: RequestFacts | None = None  # the classifier's verdict, made at most once
        self.parsed: ParsedRequest | None = None  # once its body is read: `request_body`
        self.place: Placement | None = None  # for a group's pick, made at most once
        self.failed_on: list[str] = []  # replicas it failed on before its first byte
        self.priority = Priority.STANDARD
        self.weight = 1.0  # its tenant's share of a `fair` line (its key's weight)
        self.hold = BodyHold(gw.bodies, config.server.max_inflight_body_bytes,
                             gw.bodies_full)
        self._needs: Needs | None = None
        self._prompt: int | None = None
        self.quota: QuotaHold | None = None  # its reservation against its key's limits
        self.trace: RequestTrace | None = None  # its spans (tracing on)
        self.failed: FailureKind | None = None  # how its upstream exchange failed, if it did
        self.big = False  # its body was parsed off the loop (router.request.big_body)
        self.batch = False  # a batch line: it gives its slot up to an interactive request

    @property
    def request_body(self) -> ParsedRequest:
        """The request as parsed: read only once its body is (from admission on)."""
        parsed = self.parsed
        assert parsed is not None, "the request's body is not parsed yet"
        return parsed

    def prompt_tokens(self) -> int:
        """A generous estimate of the prompt's tokens, from the whole body's size (worked
        out once)."""
        if self._prompt is None:
            self._prompt = body_tokens(self.request_body.raw)
        return self._prompt

    def share(self) -> Share:
        """Whose it is in a `fair` line: its tenant (no key: its caller's own) and weight."""
        return Share(self.rec.tenant or "", self.weight, self.prompt_tokens())

    def fair_share(self, backend: Backend) -> Share | None:
        """Its share where `backend`'s line is fair (a free slot there is charged to its
        tenant); else None, at no cost."""
        if backend.config.queue_order is QueueOrder.FIFO:
            return None
        return self.share()

    def needs(self) -> Needs:
        """What the request needs of a backend (worked out once, when first asked)."""
        if self._needs is None:
            parsed = self.request_body
            self._needs = needs_of(parsed.body, self.prompt_tokens(), parsed.max_tokens,
                                   parsed.endpoint.api)
        return self._needs

    def able(self, primary: str) -> Capable:
        """The backends that may take the request, `primary` (its route's) whatever it
        lacks: asked of a policy only if the request may leave its primary."""
        return Capable(self, primary)

    def wants_events(self) -> bool:
        """Did the client ask for the named queue events (in the body or a header)?"""
        header = self.request.headers.get("X-Slotgate-Queue-Events", "")
        return self.request_body.queue_events or header.lower() in ("true", "1", "yes")

    def headers(self) -> dict[str, str]:
        """The gateway's headers on the answer: where it went, why, and its wait."""
        rec = self.rec
        out = {"x-request-id": rec.request_id}
        if rec.backend:
            out["x-slotgate-backend"] = rec.backend
            if rec.replica:
                out["x-slotgate-endpoint"] = rec.replica
            out["x-slotgate-route-reason"] = rec.reason or ""
            if rec.phase is not Phase.QUEUED:
                out["x-slotgate-queue-wait-ms"] = f"{rec.queue_wait_ms:.0f}"
        if rec.arm is not None and rec.experiment is not None:
            out["x-slotgate-experiment"] = rec.experiment
            out["x-slotgate-arm"] = rec.arm
        if rec.dropped_tools is not None:  # what the engine was not shown (Responses)
            out["x-slotgate-dropped-tools"] = rec.dropped_tools
        return out

    def prefer(self, backend: Backend) -> Preference:
        """The pick of `backend`'s group for it (`Candidates.place` asks it of groups only)."""
        block = backend.config.affinity.block_bytes
        if self.place is None or self.place.block_bytes != block:
            self.place = placement(self.request_body, self.request.headers.get("X-Session-Id"),
                                   block, self.prompt_tokens())
        pick = preference(backend, self.place, self.failed_on)
        self.rec.pick, self.rec.prefix_blocks = pick.reason, pick.known
        return pick

    def retry_after(self, pools: Iterable[SlotPool]) -> float:
        """When a request refused by `pools` (its queue full, its wait over) is worth
        retrying: the soonest of their forecasts of a free slot."""
        return min((pool.forecast(1) for pool in pools), default=0.0)

    def rejection(self, reason: RejectReason, after_s: float, backend: str | None,
                  message: str | None = None) -> ApiError:
        return self.gw.refuse(reason, after_s, backend, message)

    async def open_stream(self) -> None:
        """A stream that must wait gets its 200 and SSE headers at once."""
        response = web.StreamResponse(status=200, headers={**SSE_HEADERS, **self.headers()})
        self.response = response
        try:
            await response.prepare(self.request)
        except ConnectionResetError:
            raise ClientGone from None

    async def send(self, data: bytes) -> None:
        """Write on the stream already open."""
        assert self.response is not None
        try:
            await self.response.write(data)
        except ConnectionResetError:
            raise ClientGone from None

    async def fail(self, err: ApiError) -> web.StreamResponse:
        """Answer `err`: as an error response, or in-band once a stream's 200 went out."""
        err.headers.update(self.headers())
        if self.response is None:
            return self.dialect.error_response(err, self.config.server.retry_after_min_s)
        with contextlib.suppress(ClientGone, ConnectionResetError):
            await self.send(self.dialect.error_event(err))
            await self.response.write_eof()
        return self.response


class Capable:
    """The backends that may take one request, as a container a policy asks about: its
    route's primary, and those that serve what it needs (read on the first question, so
    a request that never leaves its primary never works it out)."""

    __slots__ = ("ex", "primary")

    def __init__(self, ex: Exchange, primary: str) -> None:
        self.ex, self.primary = ex, primary

    def __contains__(self, name: object) -> bool:
        if name == self.primary:
            return True  # the route chose it: never second-guessed
        backend = self.ex.config.backends.get(name) if isinstance(name, str) else None
        return backend is not None and serves(self.ex.needs(), backend.ability)
