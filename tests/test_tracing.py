"""OpenTelemetry traces end to end: a real OTLP/HTTP exporter sends each request's spans
to a receiver on loopback; the simulated engine records the traceparent it was sent."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from pydantic import ValidationError

from policies.config import Config, OtlpProtocol, TracingConfig
from router.app import RunningGateway
from router.upstream.forwarding import forward_headers
from router.upstream.simulated.engine import FaultMode
from tests.support import (
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    sim_backend,
    wait_pools,
)
from tests.support.otlp import Receiver, Span, one, receiver, traced

PROMPT = "Translate into French: 'The meeting is moved to Thursday afternoon.'"
HARD = "Write a Python function that parses an ISO 8601 duration into seconds, with tests."
CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
MINIMAL: dict[str, Any] = {"backends": {"big": {"url": "http://127.0.0.1:9/v1", "model": "m",
                                               "slots": 1}},
                           "routes": {"chat": {"primary": "big"}}}


@pytest.fixture
async def otlp(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Receiver]:
    """The receiver; the batch processor exports every 20 ms (read when a gateway starts)."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    async with receiver() as got:
        yield got


async def ask(sdk: SdkClients, gw: RunningGateway, rid: str, prompt: str = PROMPT,
              **kwargs: Any) -> Any:
    return await sdk(gw).chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": prompt}], max_tokens=8,
        extra_headers={"X-Request-Id": rid, **kwargs.pop("headers", {})}, **kwargs)


def no_content(otlp: Receiver, *texts: str) -> None:
    """No prompt (nor any part of one) in what was exported, byte for byte."""
    raw = b"".join(otlp.bodies)
    for text in texts:
        assert text.encode() not in raw and b"French" not in raw


def parent(spans: list[Span], child: Span) -> Span:
    (found,) = [s for s in spans if s.span_id == child.parent_id]
    return found


async def test_one_trace_per_request_with_its_server_and_upstream_spans(
    otlp: Receiver, start: StartGateway, sdk: SdkClients
) -> None:
    gw = await start(traced(gateway_config(sim_backend("llama-70b", slots=1)), otlp))
    reply = await ask(sdk, gw, "one", user="u1")
    assert reply.parse().choices
    spans = await otlp.trace_of("one", 2)
    server, upstream = one(spans, "chat chat"), one(spans, "slotgate.upstream")
    assert len(spans) == 2 and server.parent_id == "" and parent(spans, upstream) == server
    assert (server.kind, upstream.kind, server.service) == ("server", "client", "slotgate")
    a = server.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "chat"
    assert a["gen_ai.response.model"] == "llama-70b" and a["gen_ai.request.max_tokens"] == 8
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] == 8
    assert (a["slotgate.route"], a["slotgate.backend"], a["slotgate.replica"]) == (
        "chat", "big", "big")
    assert a["slotgate.reason"] == "primary" and a["slotgate.priority"] == "standard"
    assert a["http.response.status_code"] == 200 and "error.type" not in a
    assert isinstance(a["slotgate.tenant"], str)
    u = upstream.attributes
    assert (u["slotgate.backend"], u["slotgate.retry"], u["http.response.status_code"]) == (
        "big", 0, 200)
    assert u["server.address"] == "127.0.0.1" and u["server.port"] > 0
    assert server.start_ns <= upstream.start_ns <= upstream.end_ns <= server.end_ns
    # The engine continues the trace from the attempt's span.
    sent = engine(gw).records["one"].traceparent
    assert sent is not None and sent.startswith(f"00-{server.trace_id}-{upstream.span_id}-")
    no_content(otlp, PROMPT)
    await assert_idle(gw)


def steering(otlp: Receiver) -> dict[str, Any]:
    """A route that steers simple requests to `small` (one slot) when `big` (one) is full."""
    raw = gateway_config(sim_backend("big-70b", slots=1, queue_limit=4),
                         sim_backend("small-8b", slots=1), overflow="fallback")
    raw["routes"]["chat"]["fallback"] = {"when": "saturated"}
    return traced(raw, otlp)


async def test_a_queued_request_moved_to_the_fallback_shows_its_wait_and_verdict(
    otlp: Receiver, start: StartGateway, sdk: SdkClients
) -> None:
    gw = await start(steering(otlp))
    big, small = engine(gw, "big"), engine(gw, "small")
    big.hold()
    small.hold()
    busy = asyncio.create_task(ask(sdk, gw, "busy", HARD))  # the primary's one slot
    await big.wait_until(lambda e: "busy" in e.records)
    first = asyncio.create_task(ask(sdk, gw, "first"))  # steered: the fallback's one slot
    await small.wait_until(lambda e: "first" in e.records)
    moved = asyncio.create_task(ask(sdk, gw, "moved"))  # queues for the primary
    await wait_pools(gw, lambda s: s["big"] == (1, 1))
    small.release()  # the fallback frees: the queued request moves there
    assert (await moved).headers["x-slotgate-backend"] == "small"
    await first
    big.release()
    await busy
    spans = await otlp.trace_of("moved", 4)
    server = one(spans, "chat chat")
    classify, queue = one(spans, "slotgate.classify"), one(spans, "slotgate.queue")
    upstream = one(spans, "slotgate.upstream")
    assert {parent(spans, s).span_id for s in (classify, queue, upstream)} == {server.span_id}
    assert classify.attributes["slotgate.intent"] == "translate"
    assert 0 <= classify.attributes["slotgate.p_simple"] <= 1
    assert classify.attributes["slotgate.verdict"] == "simple"
    assert queue.attributes["slotgate.backend"] == "big"
    assert queue.attributes["slotgate.queue.position"] == 1
    assert queue.attributes["slotgate.queue.outcome"] == "moved"
    assert queue.attributes["slotgate.queue.wait_ms"] > 0
    assert classify.end_ns <= queue.start_ns <= queue.end_ns <= upstream.start_ns
    assert upstream.attributes["slotgate.backend"] == "small"
    assert server.attributes["slotgate.reason"].startswith("fallback:simple:translate:")
    no_content(otlp, PROMPT, HARD)
    await assert_idle(gw)


async def test_a_retried_request_shows_both_attempts(
    otlp: Receiver, start: StartGateway, sdk: SdkClients
) -> None:
    gw = await start(traced(gateway_config(sim_backend("m", slots=1),
                                           sim_backend("m-small", slots=1)), otlp))
    engine(gw).inject_fault(FaultMode.ERROR_500)
    assert (await ask(sdk, gw, "retried")).headers["x-slotgate-backend"] == "small"
    spans = await otlp.trace_of("retried", 3)
    first, second = sorted((s for s in spans if s.name == "slotgate.upstream"),
                           key=lambda s: s.start_ns)
    assert (first.attributes["slotgate.backend"], first.attributes["slotgate.retry"]) == (
        "big", 0)
    assert first.attributes["http.response.status_code"] == 500
    assert first.attributes["error.type"] == "upstream_5xx"
    assert (second.attributes["slotgate.backend"], second.attributes["slotgate.retry"]) == (
        "small", 1)
    assert one(spans, "chat chat").attributes["slotgate.reason"] == "retry:big"
    # Each engine was sent its own attempt's context.
    assert f"-{second.span_id}-" in str(engine(gw, "small").records["retried"].traceparent)
    await assert_idle(gw)


async def test_a_client_that_leaves_is_an_event_on_the_server_span(
    otlp: Receiver, start: StartGateway, sdk: SdkClients
) -> None:
    gw = await start(traced(gateway_config(sim_backend("m", slots=1)), otlp))
    sim = engine(gw)
    sim.hold()
    task = asyncio.create_task(ask(sdk, gw, "leaver"))
    await sim.wait_until(lambda e: "leaver" in e.records)
    task.cancel()
    spans = await otlp.trace_of("leaver", 2)
    server = one(spans, "chat chat")
    assert server.events == [("slotgate.client_disconnected",
                              {"slotgate.phase": "before_first_byte"})]
    assert server.attributes["error.type"] == "client_disconnected"
    assert one(spans, "slotgate.upstream").attributes["error.type"] == "client_disconnected"
    sim.release()
    await assert_idle(gw)


async def test_a_rejection_names_its_reason(
    otlp: Receiver, start: StartGateway, sdk: SdkClients
) -> None:
    gw = await start(traced(gateway_config(sim_backend("m", slots=1, queue_limit=0)), otlp))
    sim = engine(gw)
    sim.hold()
    held = asyncio.create_task(ask(sdk, gw, "held"))
    await sim.wait_until(lambda e: "held" in e.records)
    with pytest.raises(Exception, match="429"):
        await ask(sdk, gw, "refused")
    server = one(await otlp.trace_of("refused", 1), "chat chat")
    assert server.attributes["http.response.status_code"] == 429
    assert server.attributes["slotgate.reject_reason"] == "queue_full"
    sim.release()
    await held
    await assert_idle(gw)


async def test_an_incoming_traceparent_is_continued_and_passed_on(
    otlp: Receiver, start: StartGateway, sdk: SdkClients
) -> None:
    gw = await start(traced(gateway_config(sim_backend("m", slots=1)), otlp))
    given = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    await ask(sdk, gw, "continued", headers={"traceparent": given, "tracestate": "k=v"})
    spans = await otlp.trace_of("continued", 2)
    server, upstream = one(spans, "chat chat"), one(spans, "slotgate.upstream")
    assert (server.trace_id, server.parent_id) == (CLIENT_TRACE, CLIENT_SPAN)
    sent = engine(gw).records["continued"].traceparent
    assert sent is not None and sent.startswith(f"00-{CLIENT_TRACE}-{upstream.span_id}-")
    await assert_idle(gw)


async def test_an_unsampled_trace_exports_nothing_yet_passes_its_context_on(
    otlp: Receiver, start: StartGateway, sdk: SdkClients
) -> None:
    gw = await start(traced(gateway_config(sim_backend("m", slots=1)), otlp))
    given = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"  # the caller did not sample it
    await ask(sdk, gw, "unsampled", headers={"traceparent": given})
    await ask(sdk, gw, "sampled")
    await otlp.trace_of("sampled", 2)
    assert not [s for s in otlp.spans if s.trace_id == CLIENT_TRACE]
    sent = engine(gw).records["unsampled"].traceparent
    assert sent is not None and sent.startswith(f"00-{CLIENT_TRACE}-") and sent.endswith("-00")
    await assert_idle(gw)


async def test_tracing_off_passes_the_clients_trace_context_through(
    start: StartGateway, sdk: SdkClients
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    assert gw.gateway.tracer is None
    given = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    await ask(sdk, gw, "plain", headers={"traceparent": given})
    assert engine(gw).records["plain"].traceparent == given  # as today: verbatim
    await assert_idle(gw)


OFF = """
import asyncio, sys
import aiohttp
from router.app import start_gateway
from router.config import config_from_dict

async def main():
    raw = {"backends": {"big": {"simulated": {"ttft_s": 0, "tokens_per_s": 0},
                                "model": "m", "slots": 1}},
           "routes": {"chat": {"primary": "big"}}}
    gw = await start_gateway(config_from_dict(raw), "127.0.0.1", 0)
    async with aiohttp.ClientSession() as http:
        for stream in (False, True):
            async with http.post(gw.url + "/v1/chat/completions", json={
                    "model": "chat", "stream": stream,
                    "messages": [{"role": "user", "content": "hi"}]},
                    headers={"traceparent": TRACEPARENT}) as r:
                assert r.status == 200, r.status
                await r.read()
    await gw.close()
    print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))

asyncio.run(main())
""".replace("TRACEPARENT", repr(f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))


def test_tracing_off_never_imports_opentelemetry() -> None:
    done = subprocess.run([sys.executable, "-c", OFF], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_section_is_off_by_default_and_checked() -> None:
    assert Config.model_validate(MINIMAL).tracing.enabled is False
    for bad in ({"sample_ratio": 1.5}, {"protocol": "zipkin"}, {"otlp_endpoint": "otel:4318"},
                {"headers_env": "not a name"}):
        with pytest.raises(ValidationError):
            Config.model_validate({**MINIMAL, "tracing": {"enabled": True, **bad}})


async def test_the_exporter_sends_the_headers_of_headers_env(
    otlp: Receiver, start: StartGateway, sdk: SdkClients, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTLP_HEADERS", "Authorization=Bearer%20s3cret,x-tenant=ops")
    gw = await start(traced(gateway_config(sim_backend("m", slots=1)), otlp,
                            headers_env="OTLP_HEADERS", service_name="edge"))
    await ask(sdk, gw, "with-headers")
    server = one(await otlp.trace_of("with-headers", 2), "chat chat")
    assert server.service == "edge"
    assert otlp.headers[-1]["authorization"] == "Bearer s3cret"
    assert otlp.headers[-1]["x-tenant"] == "ops"
    await assert_idle(gw)


def test_grpc_has_the_sdks_grpc_exporter() -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )

    from router.tracing.export import grpc_exporter

    made = grpc_exporter(TracingConfig(enabled=True, protocol=OtlpProtocol.GRPC,
                                  otlp_endpoint="http://127.0.0.1:4317"))
    assert isinstance(made, GrpcExporter)
    made.shutdown()


def test_the_gateways_trace_context_replaces_the_clients_once() -> None:
    client = CIMultiDictProxy(CIMultiDict({
        "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "TraceState": "k=v",
        "baggage": "user=1", "Host": "gw"}))
    ours = {"traceparent": f"00-{CLIENT_TRACE}-{'1' * 16}-01", "tracestate": "k=v2"}
    sent = forward_headers(client, "rid", None, "127.0.0.1", trace=ours)
    named = [(k.lower(), v) for k, v in sent]
    assert [v for k, v in named if k == "traceparent"] == [ours["traceparent"]]
    assert [v for k, v in named if k == "tracestate"] == ["k=v2"]
    assert ("baggage", "user=1") in named
    plain = [(k.lower(), v) for k, v in forward_headers(client, "rid", None, "127.0.0.1")]
    assert ("traceparent", client["traceparent"]) in plain and ("tracestate", "k=v") in plain
