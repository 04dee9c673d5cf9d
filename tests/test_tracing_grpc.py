"""OpenTelemetry traces over OTLP/gRPC end to end: `tracing.protocol: grpc` makes the
gateway export with the SDK's gRPC exporter to a real `grpc.aio` TraceService on
loopback, which decodes the spans with the official protobuf bindings."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

pytest.importorskip("grpc.aio", reason="grpcio (the `otel` extra) is not installed: no "
                    "OTLP/gRPC receiver to export to")

from tests.support import (
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    sim_backend,
)
from tests.support.otlp import Receiver, one, traced
from tests.support.otlp_grpc import grpc_receiver

PROMPT = "Translate into French: 'The meeting is moved to Thursday afternoon.'"


@pytest.fixture
async def otlp(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Receiver]:
    """The gRPC receiver; the batch processor exports every 20 ms (read at gateway start)."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    async with grpc_receiver() as got:
        yield got


async def test_a_request_is_exported_over_grpc_with_its_spans_headers_and_service(
    otlp: Receiver, start: StartGateway, sdk: SdkClients, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTLP_GRPC_HEADERS", "Authorization=Bearer%20s3cret,x-tenant=ops")
    gw = await start(traced(gateway_config(sim_backend("llama-70b", slots=1)), otlp,
                            protocol="grpc", headers_env="OTLP_GRPC_HEADERS",
                            service_name="edge-grpc"))
    reply = await sdk(gw).chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": PROMPT}], max_tokens=8,
        extra_headers={"X-Request-Id": "over-grpc"})
    assert reply.parse().choices
    spans = await otlp.trace_of("over-grpc", 2)
    server, upstream = one(spans, "chat chat"), one(spans, "slotgate.upstream")
    assert len(spans) == 2 and server.parent_id == "" and upstream.parent_id == server.span_id
    assert (server.kind, upstream.kind) == ("server", "client")
    assert server.service == upstream.service == "edge-grpc"
    a = server.attributes
    assert a["slotgate.request_id"] == "over-grpc"
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "chat"
    assert a["gen_ai.response.model"] == "llama-70b" and a["gen_ai.usage.output_tokens"] == 8
    assert a["http.response.status_code"] == 200 and a["slotgate.backend"] == "big"
    u = upstream.attributes
    assert (u["slotgate.backend"], u["slotgate.retry"], u["http.response.status_code"]) == (
        "big", 0, 200)
    assert server.start_ns <= upstream.start_ns <= upstream.end_ns <= server.end_ns
    sent = engine(gw).records["over-grpc"].traceparent
    assert sent is not None and sent.startswith(f"00-{server.trace_id}-{upstream.span_id}-")
    # headers_env's headers travel as gRPC metadata, on every export.
    assert otlp.headers and all(h["authorization"] == "Bearer s3cret" and
                                h["x-tenant"] == "ops" for h in otlp.headers)
    assert all("grpc-python" in h["user-agent"] for h in otlp.headers)  # the SDK's
    assert not any(PROMPT.encode() in body or b"French" in body for body in otlp.bodies)
    await assert_idle(gw)
