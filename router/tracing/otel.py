"""The OpenTelemetry side of tracing: imported only when `tracing.enabled`.

One SERVER span per request (`{gen_ai.operation.name} {gen_ai.request.model}`, the
GenAI semantic conventions), child of an incoming W3C `traceparent`; its children: the
wait in line (`slotgate.queue`), the classifier (`slotgate.classify`) and one CLIENT span
per upstream attempt (`slotgate.upstream`), whose context the engine receives as its
`traceparent`. Never any prompt or completion text: only the request record's facts.

Sampled as the SDK's `ParentBased(TraceIdRatioBased)` would, once per request (the
comparison made directly); the spans are then written as finished
`ReadableSpan`s, straight to the SDK's BatchSpanProcessor (whose thread encodes and exports
them, off the request path): a live SDK `Span` per step (locks, attribute checks, context
objects) would cost the request path more than the facts it records.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from aiohttp import web
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    get_current_span,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from policies.admission import RejectReason
from policies.config import TracingConfig
from router.record import RequestRecord
from router.tracing.export import exporter

_PROPAGATOR = TraceContextTextMapPropagator()
# gen_ai.operation.name of each client API (policies.apis.Api); Messages and Responses are
# chats.
_OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings",
               "responses": "chat", "messages": "chat"}
_REJECTIONS = frozenset(reason.value for reason in RejectReason)
_ERROR = Status(StatusCode.ERROR)
_UNSET = Status()
_SAMPLED, _UNSAMPLED = TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)
_NO_STATE = TraceState()
_LOW_64 = TraceIdRatioBased.TRACE_ID_LIMIT
Attrs = Mapping[str, str | int | float]


class Tracer:
    """The sampler, the ids, the batch exporter: what every request's spans share."""

    def __init__(self, config: TracingConfig) -> None:
        self.resource = Resource.create({"service.name": config.service_name})
        self.scope = InstrumentationScope("slotgate")
        # The sampling of ParentBased(TraceIdRatioBased(sample_ratio)), done in begin():
        # the SDK's sampler call cost more than the comparison it makes.
        self.bound = TraceIdRatioBased(config.sample_ratio).bound
        self.ids = RandomIdGenerator()
        self.processor = BatchSpanProcessor(exporter(config))

    def begin(self, request: web.Request, rec: RequestRecord) -> RequestTrace:
        """The request's trace, child of the caller's `traceparent` if it sent one."""
        parent = None
        if "traceparent" in request.headers:
            given = _PROPAGATOR.extract(request.headers)
            found = get_current_span(given).get_span_context()
            parent = found if found.is_valid else None
        if parent is not None:  # ParentBased: the caller's decision, and its trace state
            trace_id, sampled, state = parent.trace_id, parent.trace_flags.sampled, \
                parent.trace_state
        else:  # TraceIdRatioBased: the low 64 bits of the trace id under the ratio's bound
            trace_id = self.ids.generate_trace_id()
            sampled, state = trace_id & _LOW_64 < self.bound, _NO_STATE
        server = SpanContext(trace_id, self.ids.generate_span_id(), False,
                             _SAMPLED if sampled else _UNSAMPLED, state)
        return RequestTrace(self, server, parent, int(rec.ts * 1e9), rec.started_at)

    def close(self) -> None:
        """Flush what is pending and stop the exporter (blocking: run it off the loop)."""
        self.processor.shutdown()  # type: ignore[no-untyped-call]  # (the SDK's)


class RequestTrace:
    """One request's spans: its server span's context, and the hooks that add children."""

    __slots__ = ("_attempt", "_queue", "attempts", "parent", "recording", "served", "server",
                 "start_ns", "started_at", "tracer")

    def __init__(self, tracer: Tracer, server: SpanContext, parent: SpanContext | None,
                 start_ns: int, started_at: float) -> None:
        self.tracer, self.server, self.parent = tracer, server, parent
        # Not sampled: no child span either (the engine is sent the server span's context,
        # flagged unsampled): the cost of a trace nobody keeps stays small.
        self.recording = server.trace_flags.sampled
        self.start_ns, self.started_at = start_ns, started_at  # the same instant, two clocks
        self.attempts = 0
        self.served: str | None = None  # the model of the last engine tried
        self._attempt: tuple[int, int, dict[str, str | int | float]] | None = None
        self._queue: tuple[int, int, dict[str, str | int | float]] | None = None

    def ns(self, perf: float) -> int:
        """A time.perf_counter() reading as the epoch nanoseconds spans are stamped with."""
        return self.start_ns + int((perf - self.started_at) * 1e9)

    def emit(self, name: str, span_id: int, kind: SpanKind, attrs: Attrs, start_ns: int,
             end_ns: int, status: Status | None = None, events: tuple[Event, ...] = ()
             ) -> None:
        """A finished span of this trace, handed to the batch exporter: a child of the
        server span, or the server span itself (its parent the caller's, if any)."""
        server = self.server
        if span_id == server.span_id:
            context, parent = server, self.parent
        else:
            context = SpanContext(server.trace_id, span_id, False, server.trace_flags,
                                  server.trace_state)
            parent = server
        tracer = self.tracer
        tracer.processor.on_end(ReadableSpan(
            name, context, parent, tracer.resource, attrs, events, kind=kind,
            status=status or _UNSET, start_time=start_ns, end_time=end_ns,
            instrumentation_scope=tracer.scope))

    def queued(self, pool: str, position: int, at: float) -> None:
        """The wait in `pool`'s line begins, at `position` (1: next to be served)."""
        if self.recording:
            self._queue = (self.tracer.ids.generate_span_id(), self.ns(at),
                           {"slotgate.backend": pool, "slotgate.queue.position": position})

    def dequeued(self, outcome: str, wait_ms: float) -> None:
        """The wait is over: granted, moved (to a fallback), timed_out, shed, or left (its
        client, a drain or its backend's breaker took it out of line)."""
        if self._queue is None:
            return
        span_id, start_ns, attrs = self._queue
        self._queue = None
        attrs["slotgate.queue.outcome"] = outcome
        attrs["slotgate.queue.wait_ms"] = round(wait_ms, 3)
        self.emit("slotgate.queue", span_id, SpanKind.INTERNAL, attrs, start_ns,
                  time.time_ns())

    def classified(self, began: float, intent: str, p_simple: float) -> None:
        """The classifier's verdict (never the text it read)."""
        if self.recording:
            self.emit("slotgate.classify", self.tracer.ids.generate_span_id(),
                      SpanKind.INTERNAL,
                      {"slotgate.intent": intent, "slotgate.p_simple": round(p_simple, 4)},
                      self.ns(began), time.time_ns())

    def attempt(self, backend: str, replica: str, address: str, port: int,
                model: str) -> dict[str, str]:
        """An upstream attempt begins: its CLIENT span, whose context the engine is sent
        (the `traceparent` / `tracestate` headers returned)."""
        server = self.server
        span_id = server.span_id
        if self.recording:
            span_id = self.tracer.ids.generate_span_id()
            self._attempt = (span_id, time.time_ns(), {
                "slotgate.backend": backend, "slotgate.replica": replica,
                "server.address": address, "server.port": port,
                "slotgate.retry": self.attempts, "gen_ai.request.model": model})
        self.attempts += 1
        self.served = model
        out = {"traceparent": f"00-{server.trace_id:032x}-{span_id:016x}-"
                              f"{server.trace_flags:02x}"}
        if server.trace_state:
            out["tracestate"] = server.trace_state.to_header()
        return out

    def attempted(self, status: int, error: str | None) -> None:
        """The attempt is over: the engine's status (0: none came), the failure if any."""
        if self._attempt is None:
            return
        span_id, start_ns, attrs = self._attempt
        self._attempt = None
        if status:
            attrs["http.response.status_code"] = status
        if error is not None:
            attrs["error.type"] = error
        self.emit("slotgate.upstream", span_id, SpanKind.CLIENT, attrs, start_ns,
                  time.time_ns(), _ERROR if error is not None else None)

    def end(self, rec: RequestRecord, max_tokens: int | None) -> None:
        """The request is over: its record's facts on the server span, which ends."""
        if not self.recording:
            return
        if self._queue is not None:  # its client left while its stream opened
            self.dequeued("left", rec.queue_wait_ms)
        if self._attempt is not None:
            self.attempted(0, "client_disconnected")
        operation = _OPERATIONS.get(rec.api, rec.api)
        attrs: dict[str, str | int | float] = {
            "gen_ai.operation.name": operation, "http.response.status_code": rec.status,
            "slotgate.priority": rec.priority, "slotgate.request_id": rec.request_id}
        for key, value in (("gen_ai.request.model", rec.route),
                           ("slotgate.route", rec.route),
                           ("gen_ai.response.model", self.served),
                           ("gen_ai.request.max_tokens", max_tokens),
                           ("gen_ai.usage.input_tokens", rec.prompt_tokens),
                           ("gen_ai.usage.output_tokens", rec.completion_tokens),
                           ("slotgate.tenant", rec.tenant),
                           ("slotgate.backend", rec.backend),
                           ("slotgate.replica", rec.replica),
                           ("slotgate.reason", rec.reason),
                           ("slotgate.ttft_ms", rec.ttft_ms and round(rec.ttft_ms, 3))):
            if value is not None:
                attrs[key] = value
        if rec.error is not None:
            attrs["error.type"] = rec.error
            if rec.error in _REJECTIONS:
                attrs["slotgate.reject_reason"] = rec.error
        events: tuple[Event, ...] = ()
        end_ns = self.ns(rec.started_at + rec.total_ms / 1000)
        if rec.disconnect is not None:
            attrs["error.type"] = "client_disconnected"
            events = (Event("slotgate.client_disconnected",
                            {"slotgate.phase": rec.disconnect.value}, end_ns),)
        failed = rec.status >= 500 or rec.status == 0
        self.emit(f"{operation} {rec.route or 'unknown'}", self.server.span_id, SpanKind.SERVER,
                  attrs, self.start_ns, end_ns, _ERROR if failed else None, events)
