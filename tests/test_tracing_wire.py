"""The OTLP protobuf slotgate writes itself (router.tracing.wire) decodes to the SDK
encoder's message; its exporter's HTTP (retries, gzip) against a receiver on loopback;
the sampling done without the SDK's sampler decides as the sampler would."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence

import pytest
from aiohttp.test_utils import make_mocked_request
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util.types import Attributes

from policies.config import TracingConfig
from router.record import RequestRecord, new_id
from router.tracing.export import exporter
from router.tracing.otel import Tracer
from router.tracing.otlp_http import OtlpHttpExporter
from router.tracing.wire import SpanEncoder
from tests.support.otlp import Receiver, receiver

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
UNSET = Status()
RESOURCE = Resource.create({"service.name": "slotgate", "deployment.environment": "test"})
SCOPE, OTHER_SCOPE = InstrumentationScope("slotgate"), InstrumentationScope("other", "1.2")
TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
REMOTE = SpanContext(TRACE, 0x00F067AA0BA902B7, True, SAMPLED, TraceState([("k", "v")]))
SERVER = SpanContext(TRACE, 0x1111, False, SAMPLED, TraceState([("k", "v"), ("o", "p")]))
ATTRS: Attributes = {"gen_ai.operation.name": "chat", "http.response.status_code": 200,
         "slotgate.ttft_ms": 12.345, "slotgate.stream": True, "slotgate.off": False,
         "slotgate.empty": "", "slotgate.delta": -7, "slotgate.big": 2 ** 62,
         "slotgate.tenant": "équipe-ü", "slotgate.ids": ("a", "b"), "slotgate.ns": [1, 2]}


def span(name: str, span_id: int, parent: SpanContext | None, kind: SpanKind,
         attrs: Attributes, status: Status = UNSET, events: tuple[Event, ...] = (),
         scope: InstrumentationScope = SCOPE, links: Sequence[Link] = ()) -> ReadableSpan:
    context = SpanContext(parent.trace_id if parent else 0xABC, span_id, False, SAMPLED,
                          parent.trace_state if parent else TraceState())
    return ReadableSpan(name, context, parent, RESOURCE, attrs, events, links, kind=kind,
                        status=status, start_time=1_764_633_600_000_000_000 + span_id,
                        end_time=1_764_633_600_250_000_000 + span_id,
                        instrumentation_scope=scope)


SPANS = [
    span("chat chat", SERVER.span_id, REMOTE, SpanKind.SERVER, ATTRS,
         Status(StatusCode.ERROR, "upstream failed"),
         (Event("slotgate.client_disconnected", {"slotgate.phase": "stream"}, 5),)),
    span("slotgate.upstream", 0x2222, SERVER, SpanKind.CLIENT,
         {"slotgate.backend": "big", "server.port": 8000, "slotgate.retry": 0},
         Status(StatusCode.ERROR)),
    span("slotgate.classify", 0x3333, SERVER, SpanKind.INTERNAL,
         {"slotgate.intent": "code", "slotgate.p_simple": 0.25}, Status(StatusCode.OK),
         scope=OTHER_SCOPE, links=[Link(REMOTE, {"why": "follows"})]),
    span("root", 0x4444, None, SpanKind.INTERNAL, {}),
    span("slotgate.queue", 0x5555, SERVER, SpanKind.INTERNAL,
         {"slotgate.backend": "big", "slotgate.queue.position": 1}),
]


def test_our_bytes_decode_to_the_sdk_encoders_message() -> None:
    encoder = SpanEncoder()
    for _ in range(2):  # the second time from the caches
        ours = ExportTraceServiceRequest.FromString(encoder.request(SPANS))
        assert ours == encode_spans(SPANS)
    assert len(ours.resource_spans) == 1 and len(ours.resource_spans[0].scope_spans) == 2


VALUES: tuple[int | bool | float | str, ...] = (1, True, 1.0, "1", 1, True)


def test_a_cached_value_keeps_its_type() -> None:
    encoder = SpanEncoder()
    spans = [span("s", 0x10 + i, SERVER, SpanKind.INTERNAL, {"k": value})
             for i, value in enumerate(VALUES)]
    ours = ExportTraceServiceRequest.FromString(encoder.request(spans))
    assert ours == encode_spans(spans)
    values = [s.attributes[0].value.WhichOneof("value")
              for s in ours.resource_spans[0].scope_spans[0].spans]
    assert values == ["int_value", "bool_value", "double_value", "string_value",
                      "int_value", "bool_value"]


async def export(got: Receiver, gzip_body: bool = False) -> SpanExportResult:
    exporter = OtlpHttpExporter(got.url + "/v1/traces", {"x-tenant": "ops"},
                                gzip_body=gzip_body)
    try:
        return await asyncio.to_thread(exporter.export, SPANS)
    finally:
        exporter.shutdown()


async def test_the_exporter_retries_what_the_collector_cannot_take_yet() -> None:
    async with receiver() as got:
        got.refuse += [503, 429]
        assert await export(got) is SpanExportResult.SUCCESS
        assert got.posts == 3 and len(got.spans) == len(SPANS)
        assert got.headers[-1]["content-type"] == "application/x-protobuf"
        assert got.headers[-1]["x-tenant"] == "ops"


async def test_the_exporter_gives_up_on_a_refusal_at_once() -> None:
    async with receiver() as got:
        got.refuse.append(400)
        assert await export(got) is SpanExportResult.FAILURE
        assert got.posts == 1 and got.spans == []


async def test_the_exporter_gzips_when_asked() -> None:
    async with receiver() as got:
        assert await export(got, gzip_body=True) is SpanExportResult.SUCCESS
        assert got.headers[-1]["content-encoding"] == "gzip"
        assert ExportTraceServiceRequest.FromString(got.bodies[-1]) == encode_spans(SPANS)


async def test_an_unreachable_collector_fails_the_batch_within_the_deadline() -> None:
    async with receiver() as got:
        url = got.url
    exporter = OtlpHttpExporter(url + "/v1/traces", timeout_s=0.5)
    assert await asyncio.to_thread(exporter.export, SPANS) is SpanExportResult.FAILURE
    exporter.shutdown()


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.5, 1.0])
def test_the_sampling_decides_as_the_sdks_sampler(ratio: float) -> None:
    tracer = Tracer(TracingConfig(enabled=True, otlp_endpoint="http://127.0.0.1:9",
                                  sample_ratio=ratio))
    sampler, rng = TraceIdRatioBased(ratio), random.Random(7)
    request = make_mocked_request("POST", "/v1/chat/completions")
    try:
        for _ in range(500):
            rec = RequestRecord(new_id(), "/v1/chat/completions", time.perf_counter(),
                                time.time(), new_id())
            trace = tracer.begin(request, rec)
            verdict = sampler.should_sample(None, trace.server.trace_id, "x")
            assert trace.recording is (verdict.decision is Decision.RECORD_AND_SAMPLE)
        # and through a caller's traceparent, its decision
        for flags in ("00", "01"):
            parent = f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-{flags}"
            trace = tracer.begin(make_mocked_request(
                "POST", "/v1/chat/completions", headers={"traceparent": parent,
                                                         "tracestate": "a=b"}), rec)
            assert trace.recording is (flags == "01")
            assert trace.server.trace_state.to_header() == "a=b"
    finally:
        tracer.close()


async def test_without_an_endpoint_the_exporter_reads_the_sdks_environment(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    async with receiver() as got:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", got.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-team=a%20b")
        made = exporter(TracingConfig(enabled=True))
        try:
            assert await asyncio.to_thread(made.export, SPANS) is SpanExportResult.SUCCESS
        finally:
            made.shutdown()
        assert len(got.spans) == len(SPANS) and got.headers[-1]["x-team"] == "a b"
