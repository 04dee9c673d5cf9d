"""The OTLP protobuf slotgate writes itself (router.tracing.wire) decodes to the SDK
encoder's message; its exporter's HTTP (retries, gzip) against a receiver on loopback;
the sampling done without the SDK's sampler decides as the sampler would."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.sampling import Decision, TraceIdRatioBased

from policies.config import TracingConfig
from router.common.record import RequestRecord, new_id
from router.tracing.export import http_exporter
from router.tracing.otel import SCOPE, DropWarnings, Tracer, readable
from router.tracing.otlp_http import OtlpHttpExporter
from router.tracing.spans import CLIENT, INTERNAL, SERVER, Attrs, Event, SpanFacts
from router.tracing.wire import SpanEncoder
from tests.support.otlp import Receiver, receiver

RESOURCE = Resource.create({"service.name": "slotgate", "deployment.environment": "test"})
TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER = 0x00F067AA0BA902B7
ATTRS: Attrs = {"gen_ai.operation.name": "chat", "http.response.status_code": 200,
                "slotgate.ttft_ms": 12.345, "slotgate.stream": True, "slotgate.off": False,
                "slotgate.empty": "", "slotgate.delta": -7, "slotgate.big": 2 ** 62,
                "slotgate.tenant": "équipe-ü", "slotgate.ids": ("a", "b"),  # type: ignore[dict-item]
                "slotgate.ns": [1, 2]}  # type: ignore[dict-item]


@dataclass
class Trace:
    """A finished trace as the encoder reads one (the gateway's is RequestTrace)."""

    trace_id: int
    state: str
    facts: list[SpanFacts]

    def spans(self) -> list[SpanFacts]:
        return self.facts


def fact(name: str, span_id: int, parent: int | None, kind: int, attrs: Attrs,
         **more: Any) -> SpanFacts:
    return SpanFacts(name, span_id, parent, kind, 1_764_633_600_000_000_000 + span_id,
                     1_764_633_600_250_000_000 + span_id, attrs, **more)


TRACES = [
    Trace(TRACE, "k=v,o=p", [
        fact("slotgate.upstream", 0x2222, 0x1111, CLIENT,
             {"slotgate.backend": "big", "server.port": 8000, "slotgate.retry": 0},
             failed=True),
        fact("slotgate.classify", 0x3333, 0x1111, INTERNAL,
             {"slotgate.intent": "code", "slotgate.p_simple": 0.25}),
        fact("slotgate.queue", 0x5555, 0x1111, INTERNAL,
             {"slotgate.backend": "big", "slotgate.queue.position": 1}),
        fact("chat chat", 0x1111, CALLER, SERVER, ATTRS, failed=True, remote_parent=True,
             events=(Event("slotgate.client_disconnected", 5, {"slotgate.phase": "stream"}),)),
    ]),
    Trace(0xABC, "", [fact("root", 0x4444, None, SERVER, {})]),
]
SPANS = [span for trace in TRACES for span in readable(trace, RESOURCE)]


def encoder() -> SpanEncoder:
    return SpanEncoder(RESOURCE.attributes, SCOPE)


def test_our_bytes_decode_to_the_sdk_encoders_message() -> None:
    ours = encoder()
    for _ in range(2):  # the second time from the caches
        got = ExportTraceServiceRequest.FromString(ours.request(TRACES))
        assert got == encode_spans(SPANS)
    assert len(got.resource_spans) == 1 and len(got.resource_spans[0].scope_spans) == 1
    assert len(got.resource_spans[0].scope_spans[0].spans) == 5


VALUES: tuple[int | bool | float | str, ...] = (1, True, 1.0, "1", 1, True)


def test_a_cached_value_keeps_its_type() -> None:
    traces = [Trace(TRACE, "", [fact("s", 0x10 + i, 0x1111, INTERNAL, {"k": value})
                                for i, value in enumerate(VALUES)])]
    ours = ExportTraceServiceRequest.FromString(encoder().request(traces))
    assert ours == encode_spans(readable(traces[0], RESOURCE))
    values = [s.attributes[0].value.WhichOneof("value")
              for s in ours.resource_spans[0].scope_spans[0].spans]
    assert values == ["int_value", "bool_value", "double_value", "string_value",
                      "int_value", "bool_value"]


async def export(got: Receiver, gzip_body: bool = False) -> SpanExportResult:
    exporter = OtlpHttpExporter(got.url + "/v1/traces", encoder(), {"x-tenant": "ops"},
                                gzip_body=gzip_body)
    try:
        return await asyncio.to_thread(exporter.export, TRACES)
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
    exporter = OtlpHttpExporter(url + "/v1/traces", encoder(), timeout_s=0.5)
    assert await asyncio.to_thread(exporter.export, TRACES) is SpanExportResult.FAILURE
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
            verdict = sampler.should_sample(None, trace.trace_id, "x")
            assert trace.recording is (verdict.decision is Decision.RECORD_AND_SAMPLE)
        # and through a caller's traceparent, its decision
        for flags in ("00", "01"):
            parent = f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-{flags}"
            trace = tracer.begin(make_mocked_request(
                "POST", "/v1/chat/completions", headers={"traceparent": parent,
                                                         "tracestate": "a=b"}), rec)
            assert trace.recording is (flags == "01")
            assert trace.state == "a=b" and trace.parent_id is not None
    finally:
        tracer.close()


async def test_without_an_endpoint_the_exporter_reads_the_sdks_environment(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    async with receiver() as got:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", got.url)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-team=a%20b")
        made = http_exporter(TracingConfig(enabled=True), RESOURCE.attributes, SCOPE)
        try:
            assert await asyncio.to_thread(made.export, TRACES) is SpanExportResult.SUCCESS
        finally:
            made.shutdown()
        assert len(got.spans) == len(SPANS) and got.headers[-1]["x-team"] == "a b"


async def test_a_full_queue_warns_once_not_per_dropped_trace(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "1")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1")
    request = make_mocked_request("POST", "/v1/chat/completions")
    async with receiver() as got:
        tracer = Tracer(TracingConfig(enabled=True, otlp_endpoint=got.url))
        [drops] = [f for f in logging.getLogger("opentelemetry.sdk._shared_internal").filters
                   if isinstance(f, DropWarnings)]
        drops.next_at = 0.0  # (one filter per process: another test may have used it)
        # This loop holds the event loop, so the receiver answers no export meanwhile: the
        # exporter's thread waits on its first batch, and the one-trace queue overflows.
        for _ in range(50):
            rec = RequestRecord(new_id(), "/v1/chat/completions", time.perf_counter(),
                                time.time(), new_id(), status=200)
            tracer.begin(request, rec).end(rec, None)
        await asyncio.to_thread(tracer.close)
    full = [r.getMessage() for r in caplog.records if "queue is full" in r.getMessage()]
    assert len(got.spans) <= 3  # most were dropped...
    assert len(full) == 1 and "traces dropped" in full[0]  # ...and said so once
    assert not [r for r in caplog.records if r.getMessage().startswith("Queue full")]
