"""An OTLP/HTTP trace receiver on loopback (POST /v1/traces), decoding what an exporter
sends with the official protobuf bindings; tests wait for the spans they expect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

_KINDS = {1: "internal", 2: "server", 3: "client"}


@dataclass(frozen=True)
class Span:
    name: str
    kind: str
    trace_id: str  # hex, as in a traceparent
    span_id: str
    parent_id: str  # "" for a root
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    service: str

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    return None if which is None else getattr(v, which)


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class Receiver:
    url: str = ""
    spans: list[Span] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)  # as exported (aiohttp un-gzips)
    headers: list[dict[str, str]] = field(default_factory=list)  # of each export
    refuse: list[int] = field(default_factory=list)  # statuses to answer first (Retry-After 0)
    posts: int = 0  # exports tried, refused ones included
    _arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.posts += 1
        if self.refuse:
            return web.Response(status=self.refuse.pop(0), headers={"Retry-After": "0"})
        await self.take(ExportTraceServiceRequest.FromString(body), body,
                        {k.lower(): v for k, v in request.headers.items()})
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def take(self, decoded: ExportTraceServiceRequest, body: bytes,
                   headers: dict[str, str]) -> None:
        """Record one export (its spans, bytes and headers) and wake the waiters; shared
        by the OTLP/HTTP route above and the OTLP/gRPC service (tests/support/otlp_grpc)."""
        async with self._arrived:
            self.bodies.append(body)
            self.headers.append(headers)
            for resource in decoded.resource_spans:
                service = str(_attrs(resource.resource.attributes).get("service.name"))
                for scope in resource.scope_spans:
                    self.spans += [Span(
                        s.name, _KINDS.get(s.kind, str(s.kind)), s.trace_id.hex(),
                        s.span_id.hex(), s.parent_span_id.hex(), s.start_time_unix_nano,
                        s.end_time_unix_nano, _attrs(s.attributes),
                        [(e.name, _attrs(e.attributes)) for e in s.events], service)
                        for s in scope.spans]
            self._arrived.notify_all()

    async def wait_for(self, predicate: Callable[[list[Span]], bool],
                       within_s: float = 10.0) -> list[Span]:
        """The spans received, once `predicate` holds of them (each batch re-checks)."""
        async with asyncio.timeout(within_s), self._arrived:
            await self._arrived.wait_for(lambda: predicate(self.spans))
        return self.spans

    def trace(self, request_id: str) -> list[Span]:
        """Every span of the trace whose server span carries `request_id`."""
        (root,) = [s for s in self.spans if s.attributes.get("slotgate.request_id") == request_id]
        return [s for s in self.spans if s.trace_id == root.trace_id]

    async def trace_of(self, request_id: str, count: int) -> list[Span]:
        """The trace of `request_id` once `count` of its spans arrived."""
        def whole(spans: list[Span]) -> bool:
            roots = [s for s in spans if s.attributes.get("slotgate.request_id") == request_id]
            return bool(roots) and sum(s.trace_id == roots[0].trace_id for s in spans) >= count
        await self.wait_for(whole)
        return self.trace(request_id)


def traced(raw: dict[str, Any], otlp: Receiver, **tracing: Any) -> dict[str, Any]:
    """A gateway config `raw`, tracing to `otlp` (more of the section in `tracing`)."""
    raw["tracing"] = {"enabled": True, "otlp_endpoint": otlp.url, **tracing}
    return raw


def one(spans: list[Span], name: str) -> Span:
    (found,) = [s for s in spans if s.name == name]
    return found


def tree(spans: list[Span]) -> str:
    """The trace as an indented text tree with each span's offset and duration."""
    t0 = min(s.start_ns for s in spans)
    children: dict[str, list[Span]] = {}
    ids = {s.span_id for s in spans}
    for s in sorted(spans, key=lambda s: s.start_ns):
        children.setdefault(s.parent_id if s.parent_id in ids else "", []).append(s)
    lines: list[str] = []

    def show(span: Span, depth: int) -> None:
        offset = (span.start_ns - t0) / 1e6
        lines.append(f"{'  ' * depth}{span.name} [{span.kind}] +{offset:.1f} ms, "
                     f"{span.ms:.1f} ms")
        for key, value in sorted(span.attributes.items()):
            lines.append(f"{'  ' * depth}    {key} = {value!r}")
        for name, attrs in span.events:
            lines.append(f"{'  ' * depth}    event {name} {attrs}")
        for child in children.get(span.span_id, []):
            show(child, depth + 1)

    for root in children.get("", []):
        show(root, 0)
    return "\n".join(lines)


@asynccontextmanager
async def receiver() -> AsyncIterator[Receiver]:
    """A receiver serving on a free loopback port until the block ends."""
    got = Receiver()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", got._traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    got.url = f"http://127.0.0.1:{port}"
    try:
        yield got
    finally:
        await runner.cleanup()
