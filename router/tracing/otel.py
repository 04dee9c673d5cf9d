"""The OpenTelemetry side of tracing: imported only when `tracing.enabled`.

One SERVER span per request (`{gen_ai.operation.name} {gen_ai.request.model}`, the
GenAI semantic conventions), child of an incoming W3C `traceparent`; its children: the
wait in line (`slotgate.queue`), the classifier (`slotgate.classify`) and one CLIENT span
per upstream attempt (`slotgate.upstream`), whose context the engine receives as its
`traceparent`. Spans are made with explicit parents (no context variables) and exported
by a BatchSpanProcessor's own thread, off the request path. Never any prompt or
completion text: only the request record's facts.
"""

from __future__ import annotations

import logging
import os
from urllib.parse import unquote

from aiohttp import web
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from policies.admission import RejectReason
from policies.config import OtlpProtocol, TracingConfig
from router.record import RequestRecord

log = logging.getLogger("slotgate")
_PROPAGATOR = TraceContextTextMapPropagator()
# gen_ai.operation.name of each client API (policies.apis.Api); Messages and Responses are
# chats.
_OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings",
               "responses": "chat", "messages": "chat"}
_REJECTIONS = frozenset(reason.value for reason in RejectReason)
_MAX_HEADERS = 64


class Tracer:
    """The provider (sampler, batch exporter) and the tracer every request's spans use."""

    def __init__(self, config: TracingConfig) -> None:
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}),
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)))
        self.processor: SpanProcessor = BatchSpanProcessor(exporter(config))
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("slotgate")

    def begin(self, request: web.Request, rec: RequestRecord) -> RequestTrace:
        """The request's server span, child of the caller's `traceparent` if it sent one."""
        parent = (_PROPAGATOR.extract(request.headers) if "traceparent" in request.headers
                  else None)
        start_ns = int(rec.ts * 1e9)
        span = self.tracer.start_span(rec.endpoint, parent, SpanKind.SERVER,
                                      start_time=start_ns)
        if span.is_recording():
            span.set_attribute("slotgate.request_id", rec.request_id)
        return RequestTrace(self, span, start_ns, rec.started_at)

    def close(self) -> None:
        """Flush what is pending and stop the exporter (blocking: run it off the loop)."""
        self.provider.shutdown()


def exporter(config: TracingConfig) -> SpanExporter:
    """The OTLP exporter `config` names, its headers from `headers_env` (never logged)."""
    headers = _headers(config.headers_env)
    if config.protocol is OtlpProtocol.GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )
        return GrpcExporter(endpoint=config.otlp_endpoint, headers=headers,
                            insecure=(config.otlp_endpoint or "").startswith("http://") or None)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    endpoint = config.otlp_endpoint
    if endpoint is not None and endpoint.rstrip("/").count("/") == 2:  # no path: the
        endpoint = endpoint.rstrip("/") + "/v1/traces"  # collector's usual one
    return OTLPSpanExporter(endpoint=endpoint, headers=headers)


def _headers(env: str | None) -> dict[str, str] | None:
    """`key=value,key2=value2` (values URL-encoded, as OTEL_EXPORTER_OTLP_HEADERS)."""
    if env is None:
        return None
    raw = os.environ.get(env)
    if raw is None:
        log.warning("tracing.headers_env names %s, which is not set: no exporter headers",
                    env)
        return None
    out: dict[str, str] = {}
    for item in raw.split(",")[:_MAX_HEADERS]:
        key, sep, value = item.partition("=")
        if sep and key.strip():
            out[key.strip().lower()] = unquote(value.strip())
    return out


class RequestTrace:
    """One request's server span and the hooks that add its children."""

    __slots__ = ("_attempt", "_context", "_queue", "_tracer", "attempts", "recording",
                 "served", "span", "start_ns", "started_at")

    def __init__(self, tracer: Tracer, span: Span, start_ns: int, started_at: float) -> None:
        self._tracer = tracer.tracer
        self.span = span
        self._context: Context = set_span_in_context(span)
        # Not sampled: no child span either (the engine is sent the server span's context,
        # its flag unsampled): the cost of a trace nobody keeps stays small.
        self.recording = span.is_recording()
        self.start_ns, self.started_at = start_ns, started_at  # the same instant, two clocks
        self.attempts = 0
        self._attempt: Span | None = None  # the upstream attempt under way
        self._queue: Span | None = None  # the wait in line under way
        self.served: str | None = None  # the model of the last engine tried

    def ns(self, perf: float) -> int:
        """A time.perf_counter() reading as the epoch nanoseconds spans are stamped with."""
        return self.start_ns + int((perf - self.started_at) * 1e9)

    def child(self, name: str, kind: SpanKind = SpanKind.INTERNAL,
              at: float | None = None) -> Span:
        return self._tracer.start_span(name, self._context, kind,
                                       start_time=None if at is None else self.ns(at))

    def queued(self, pool: str, position: int, at: float) -> None:
        """The wait in `pool`'s line begins, at `position` (1: next to be served)."""
        if not self.recording:
            return
        span = self._queue = self.child("slotgate.queue", at=at)
        if span.is_recording():
            span.set_attributes({"slotgate.backend": pool, "slotgate.queue.position": position})

    def dequeued(self, outcome: str, wait_ms: float) -> None:
        """The wait is over: granted, moved (to a fallback), timed_out, shed, or left (its
        client, a drain or its backend's breaker took it out of line)."""
        span, self._queue = self._queue, None
        if span is None:
            return
        if span.is_recording():
            span.set_attributes({"slotgate.queue.outcome": outcome,
                                 "slotgate.queue.wait_ms": round(wait_ms, 3)})
        span.end()

    def classified(self, began: float, intent: str, p_simple: float) -> None:
        """The classifier's verdict (never the text it read)."""
        if not self.recording:
            return
        span = self.child("slotgate.classify", at=began)
        if span.is_recording():
            span.set_attributes({"slotgate.intent": intent,
                                 "slotgate.p_simple": round(p_simple, 4)})
        span.end()

    def attempt(self, backend: str, replica: str, address: str, port: int,
                model: str) -> dict[str, str]:
        """An upstream attempt begins: its CLIENT span, whose context the engine is sent
        (the `traceparent` / `tracestate` headers returned)."""
        carrier: dict[str, str] = {}
        if not self.recording:
            _PROPAGATOR.inject(carrier, self._context)
            return carrier
        span = self.child("slotgate.upstream", SpanKind.CLIENT)
        if span.is_recording():
            span.set_attributes({"slotgate.backend": backend, "slotgate.replica": replica,
                                 "server.address": address,
                                 "slotgate.retry": self.attempts,
                                 "server.port": port, "gen_ai.request.model": model})
        self.attempts += 1
        self.served, self._attempt = model, span
        _PROPAGATOR.inject(carrier, set_span_in_context(span))
        return carrier

    def attempted(self, status: int, error: str | None) -> None:
        """The attempt is over: the engine's status (0: none came), the failure if any."""
        span, self._attempt = self._attempt, None
        if span is None:
            return
        if span.is_recording():
            if status:
                span.set_attribute("http.response.status_code", status)
            if error is not None:
                span.set_attribute("error.type", error)
                span.set_status(Status(StatusCode.ERROR))
        span.end()

    def end(self, rec: RequestRecord, max_tokens: int | None) -> None:
        """The request is over: its record's facts on the server span, which ends."""
        if self._queue is not None:  # its client left while its stream opened
            self.dequeued("left", rec.queue_wait_ms)
        if self._attempt is not None:
            self.attempted(0, "client_disconnected")
        span = self.span
        if span.is_recording():
            operation = _OPERATIONS.get(rec.api, rec.api)
            model = rec.route or "unknown"
            span.update_name(f"{operation} {model}")
            attrs: dict[str, str | int | float] = {
                "gen_ai.operation.name": operation, "http.response.status_code": rec.status,
                "slotgate.priority": rec.priority}
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
            if rec.disconnect is not None:
                attrs["error.type"] = "client_disconnected"
                span.add_event("slotgate.client_disconnected",
                               {"slotgate.phase": rec.disconnect.value})
            span.set_attributes(attrs)
            if rec.status >= 500 or rec.status == 0:
                span.set_status(Status(StatusCode.ERROR))
        span.end(self.ns(rec.started_at + rec.total_ms / 1000))
