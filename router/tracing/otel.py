"""The OpenTelemetry side of tracing: imported only when `tracing.enabled`.

Sampled as the SDK's `ParentBased(TraceIdRatioBased)` would, once per request (the
comparison made directly). A sampled request's trace (`router.tracing.spans`) is handed,
once it has ended, to the SDK's BatchSpanProcessor, whose thread encodes and exports it
off the request path: slotgate's own encoder over http/protobuf, the SDK's gRPC exporter
(fed the SDK's `ReadableSpan`s, made on that thread) over grpc. A live SDK `Span` per
step (locks, attribute checks, context objects) would cost the request path more than
the facts it records.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping, Sequence

from aiohttp import web
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
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

from policies.config import OtlpProtocol, TracingConfig
from router.common.record import RequestRecord
from router.tracing.context import tracestate_within
from router.tracing.export import grpc_exporter, http_exporter
from router.tracing.spans import RequestTrace, SpanFacts
from router.tracing.wire import TraceLike

_PROPAGATOR = TraceContextTextMapPropagator()
_LOW_64 = TraceIdRatioBased.TRACE_ID_LIMIT
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_KINDS = {kind.value + 1: kind for kind in SpanKind}  # OTLP's number: the SDK's kind
_ERROR, _UNSET = Status(StatusCode.ERROR), Status()
SCOPE = "slotgate"


class DropWarnings(logging.Filter):
    """The SDK's processor warns once per item it drops from a full queue: with a collector
    down under load, a line per request. This lets one through per `every_s`, saying how
    many traces were dropped since the last one."""

    def __init__(self, every_s: float = 10.0) -> None:
        super().__init__()
        self.every_s, self.next_at, self.dropped = every_s, 0.0, 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Queue full"):
            return True
        self.dropped += 1
        now = time.monotonic()
        if now < self.next_at:
            return False
        self.next_at = now + self.every_s
        record.msg, record.args = ("tracing: the export queue is full: %d traces dropped "
                                   "(a warning every %.0f s at most)",
                                   (self.dropped, self.every_s))
        self.dropped = 0
        return True


_SDK_LOG = logging.getLogger("opentelemetry.sdk._shared_internal")  # the processor's


class Tracer:
    """The sampler, the ids, the batch exporter: what every request's trace shares."""

    def __init__(self, config: TracingConfig) -> None:
        self.resource = Resource.create({"service.name": config.service_name})
        # The sampling of ParentBased(TraceIdRatioBased(sample_ratio)), done in begin():
        # the SDK's sampler call cost more than the comparison it makes.
        self.bound = TraceIdRatioBased(config.sample_ratio).bound
        self._bits = random.getrandbits  # the SDK's RandomIdGenerator's source
        exporter = (SdkSpans(grpc_exporter(config), self.resource)
                    if config.protocol is OtlpProtocol.GRPC
                    else http_exporter(config, self.resource.attributes, SCOPE))
        self.processor = BatchSpanProcessor(exporter)
        if not any(isinstance(f, DropWarnings) for f in _SDK_LOG.filters):
            _SDK_LOG.addFilter(DropWarnings())

    def span_id(self) -> int:
        """A random non-zero 64-bit span id (as the SDK's RandomIdGenerator)."""
        while not (span_id := self._bits(64)):
            pass
        return span_id

    def finished(self, trace: RequestTrace) -> None:
        """A sampled request's trace is over: to the batch processor's queue."""
        self.processor.on_end(trace)  # type: ignore[arg-type]  # (spans._Sampled says why)

    def begin(self, request: web.Request, rec: RequestRecord) -> RequestTrace:
        """The request's trace, child of the caller's `traceparent` if it sent one."""
        parent = None
        headers = request.headers
        if "traceparent" in headers:
            # a tracestate past its bounds is dropped unread: the parent is kept
            carrier: Mapping[str, str] = (headers if "tracestate" not in headers
                                          or tracestate_within(headers)
                                          else {"traceparent": headers["traceparent"]})
            given = _PROPAGATOR.extract(carrier)
            found = get_current_span(given).get_span_context()
            parent = found if found.is_valid else None
        if parent is not None:  # ParentBased: the caller's decision, and its trace state
            return RequestTrace(self, parent.trace_id, self.span_id(), parent.span_id,
                                parent.trace_flags.sampled, parent.trace_state.to_header(),
                                int(rec.ts * 1e9), rec.started_at)
        # TraceIdRatioBased: the low 64 bits of the trace id under the ratio's bound
        while not (trace_id := self._bits(128)):
            pass
        return RequestTrace(self, trace_id, self.span_id(), None, trace_id & _LOW_64 <
                            self.bound, "", int(rec.ts * 1e9), rec.started_at)

    def close(self) -> None:
        """Flush what is pending and stop the exporter (blocking: run it off the loop)."""
        self.processor.shutdown()  # type: ignore[no-untyped-call]  # (the SDK's)


def readable(trace: TraceLike, resource: Resource) -> list[ReadableSpan]:
    """A finished trace's spans as the SDK's `ReadableSpan`s (for its exporters)."""
    state = TraceState.from_header([trace.state]) if trace.state else TraceState()
    scope = InstrumentationScope(SCOPE)

    def context(span_id: int, remote: bool = False) -> SpanContext:
        return SpanContext(trace.trace_id, span_id, remote, _SAMPLED, state)

    def one(span: SpanFacts) -> ReadableSpan:
        parent = None if span.parent_id is None else context(span.parent_id,
                                                              span.remote_parent)
        return ReadableSpan(
            span.name, context(span.span_id), parent, resource, span.attrs,
            tuple(Event(e.name, e.attrs, e.time_ns) for e in span.events),
            kind=_KINDS[span.kind], status=_ERROR if span.failed else _UNSET,
            start_time=span.start_ns, end_time=span.end_ns, instrumentation_scope=scope)

    return [one(span) for span in trace.spans()]


class SdkSpans(SpanExporter):
    """An SDK exporter fed finished traces: each turned into `ReadableSpan`s first."""

    def __init__(self, exporter: SpanExporter, resource: Resource) -> None:
        self._exporter, self._resource = exporter, resource

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        traces: Sequence[TraceLike] = spans  # type: ignore[assignment]  # (what we queue)
        return self._exporter.export([span for trace in traces
                                      for span in readable(trace, self._resource)])

    def shutdown(self) -> None:
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._exporter.force_flush(timeout_millis)
