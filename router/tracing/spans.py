"""One request's spans as the request path writes them: plain facts, no OpenTelemetry
object, handed to the batch processor once, when the request ends.

One SERVER span per request (`{gen_ai.operation.name} {gen_ai.request.model}`, the GenAI
semantic conventions), child of an incoming W3C `traceparent`; its children: the wait in
line (`slotgate.queue`), the classifier (`slotgate.classify`) and one CLIENT span per
upstream attempt (`slotgate.upstream`), whose context the engine receives as its
`traceparent`. Never any prompt or completion text: only the request record's facts.

The request path keeps a few numbers and tuples per step; the attribute maps and the
spans themselves are made by `spans()`, on the exporter's thread, from the request's
record (final by then). Not sampled: nothing is kept, and the engine is still sent the
server span's context, flagged unsampled.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple, Protocol

from policies.scheduler.admission import RejectReason
from router.common.record import RequestRecord

# Span kinds as OTLP numbers them (the SDK's SpanKind value + 1).
INTERNAL, SERVER, CLIENT = 1, 2, 3
# gen_ai.operation.name of each client API (policies.apis.Api); Messages and Responses are
# chats.
_OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings",
               "responses": "chat", "messages": "chat"}
_REJECTIONS = frozenset(reason.value for reason in RejectReason)
Attrs = dict[str, str | int | float]


class Event(NamedTuple):
    name: str
    time_ns: int
    attrs: Attrs


class SpanFacts(NamedTuple):
    """One finished span of a request's trace (its trace id and state are the trace's)."""

    name: str
    span_id: int
    parent_id: int | None  # None: a root (no traceparent came)
    kind: int
    start_ns: int
    end_ns: int
    attrs: Attrs
    failed: bool = False  # status ERROR, else UNSET
    events: tuple[Event, ...] = ()
    remote_parent: bool = False  # the parent is the caller's span


class Tracer(Protocol):
    """What a trace asks of its tracer (`router.tracing.otel.Tracer`)."""

    def span_id(self) -> int: ...
    def finished(self, trace: RequestTrace) -> None: ...  # to the batch processor


class _Sampled:
    """What the SDK's BatchSpanProcessor reads of what it is handed: `context.trace_flags
    .sampled` (only sampled traces are handed to it)."""

    class trace_flags:  # (the SDK's attribute name)
        sampled = True


class RequestTrace:
    """One request's trace: its ids, the hooks the request path calls, and, once it has
    ended, the item the batch processor queues (`spans()` read on the exporter's thread)."""

    __slots__ = ("_attempt", "_queue", "attempts", "children", "max_tokens", "parent_id",
                 "rec", "recording", "served", "span_id", "start_ns", "started_at", "state",
                 "trace_id", "tracer")
    context = _Sampled  # for the processor (see _Sampled)

    def __init__(self, tracer: Tracer, trace_id: int, span_id: int, parent_id: int | None,
                 sampled: bool, state: str, start_ns: int, started_at: float) -> None:
        self.tracer, self.trace_id, self.span_id = tracer, trace_id, span_id
        self.parent_id, self.state = parent_id, state  # state: the `tracestate` header
        self.recording = sampled
        self.start_ns, self.started_at = start_ns, started_at  # the same instant, two clocks
        self.attempts = 0
        self.served: str | None = None  # the model of the last engine tried
        self.children: list[SpanFacts] = []
        self.rec: RequestRecord | None = None
        self.max_tokens: int | None = None
        self._attempt: tuple[int, int, tuple[Any, ...]] | None = None
        self._queue: tuple[int, int, str, int] | None = None

    def ns(self, perf: float) -> int:
        """A time.perf_counter() reading as the epoch nanoseconds spans are stamped with."""
        return self.start_ns + int((perf - self.started_at) * 1e9)

    def queued(self, pool: str, position: int, at: float) -> None:
        """The wait in `pool`'s line begins, at `position` (1: next to be served)."""
        if self.recording:
            self._queue = (self.tracer.span_id(), self.ns(at), pool, position)

    def dequeued(self, outcome: str, wait_ms: float) -> None:
        """The wait is over: granted, moved (to a fallback), timed_out, shed, or left (its
        client, a drain or its backend's breaker took it out of line)."""
        if self._queue is None:
            return
        span_id, start_ns, pool, position = self._queue
        self._queue = None
        self.children.append(SpanFacts(
            "slotgate.queue", span_id, self.span_id, INTERNAL, start_ns, time.time_ns(),
            {"slotgate.backend": pool, "slotgate.queue.position": position,
             "slotgate.queue.outcome": outcome, "slotgate.queue.wait_ms": round(wait_ms, 3)}))

    def classified(self, began: float, intent: str, p_simple: float, simple: bool) -> None:
        """The classifier's verdict (never the text it read): `simple` if the route lets
        it go to the small model (whether it goes then depends on the load)."""
        if self.recording:
            self.children.append(SpanFacts(
                "slotgate.classify", self.tracer.span_id(), self.span_id, INTERNAL,
                self.ns(began), time.time_ns(),
                {"slotgate.intent": intent, "slotgate.p_simple": round(p_simple, 4),
                 "slotgate.verdict": "simple" if simple else "hard"}))

    def attempt(self, backend: str, replica: str, address: str, port: int,
                model: str) -> dict[str, str]:
        """An upstream attempt begins: its CLIENT span, whose context the engine is sent
        (the `traceparent` / `tracestate` headers returned)."""
        span_id = self.span_id
        if self.recording:
            span_id = self.tracer.span_id()
            self._attempt = (span_id, time.time_ns(),
                             (backend, replica, address, port, self.attempts, model))
        self.attempts += 1
        self.served = model
        out = {"traceparent": f"00-{self.trace_id:032x}-{span_id:016x}-"
                              f"{'01' if self.recording else '00'}"}
        if self.state:
            out["tracestate"] = self.state
        return out

    def attempted(self, status: int, error: str | None) -> None:
        """The attempt is over: the engine's status (0: none came), the failure if any."""
        if self._attempt is None:
            return
        span_id, start_ns, (backend, replica, address, port, retry, model) = self._attempt
        self._attempt = None
        attrs: Attrs = {"slotgate.backend": backend, "slotgate.replica": replica,
                        "server.address": address, "server.port": port,
                        "slotgate.retry": retry, "gen_ai.request.model": model}
        if status:
            attrs["http.response.status_code"] = status
        if error is not None:
            attrs["error.type"] = error
        self.children.append(SpanFacts("slotgate.upstream", span_id, self.span_id, CLIENT,
                                       start_ns, time.time_ns(), attrs, error is not None))

    def end(self, rec: RequestRecord, max_tokens: int | None) -> None:
        """The request is over: its trace goes to the batch processor, its record (final
        now) read there for the server span's attributes."""
        if not self.recording:
            return
        if self._queue is not None:  # its client left while its stream opened
            self.dequeued("left", rec.queue_wait_ms)
        if self._attempt is not None:
            self.attempted(0, "client_disconnected")
        self.rec, self.max_tokens = rec, max_tokens
        self.tracer.finished(self)

    def spans(self) -> list[SpanFacts]:
        """The trace's finished spans: the children, then the server span (exporter side)."""
        rec = self.rec
        assert rec is not None, "spans() of a trace that has not ended"
        operation = _OPERATIONS.get(rec.api, rec.api)
        attrs: Attrs = {
            "gen_ai.operation.name": operation, "http.response.status_code": rec.status,
            "slotgate.priority": rec.priority, "slotgate.request_id": rec.request_id}
        for key, value in (("gen_ai.request.model", rec.route),
                           ("slotgate.route", rec.route),
                           ("gen_ai.response.model", self.served),
                           ("gen_ai.request.max_tokens", self.max_tokens),
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
            events = (Event("slotgate.client_disconnected", end_ns,
                            {"slotgate.phase": rec.disconnect.value}),)
        return [*self.children, SpanFacts(
            f"{operation} {rec.route or 'unknown'}", self.span_id, self.parent_id, SERVER,
            self.start_ns, end_ns, attrs, rec.status >= 500 or rec.status == 0, events,
            self.parent_id is not None)]
