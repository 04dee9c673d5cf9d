"""An OTLP/gRPC trace receiver on loopback: a `grpc.aio` server implementing the
collector's TraceService/Export, recording into the same `Receiver` as the OTLP/HTTP one
(tests/support/otlp.py), each export's gRPC metadata as its headers
(`refuse` is the HTTP receiver's alone).

A module of its own so that the HTTP receiver never needs grpcio: a test module skips
(`pytest.importorskip("grpc.aio")`) before it imports this one."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc.aio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import (
    TraceServiceServicer,
    add_TraceServiceServicer_to_server,
)

from tests.support.otlp import Receiver


class _TraceService(TraceServiceServicer):
    """Export: every request into `receiver`; text metadata as lower-cased headers."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    async def Export(self, request: ExportTraceServiceRequest,
                     context: Any) -> ExportTraceServiceResponse:
        self.receiver.posts += 1
        metadata = {str(key).lower(): value for key, value in
                    context.invocation_metadata() or () if isinstance(value, str)}
        await self.receiver.take(request, request.SerializeToString(), metadata)
        return ExportTraceServiceResponse()


@asynccontextmanager
async def grpc_receiver() -> AsyncIterator[Receiver]:
    """A receiver serving OTLP/gRPC on a free loopback port (`url`: http://127.0.0.1:PORT,
    the form `tracing.otlp_endpoint` takes) until the block ends."""
    got = Receiver()
    server = grpc.aio.server()
    add_TraceServiceServicer_to_server(_TraceService(got), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    got.url = f"http://127.0.0.1:{port}"
    try:
        yield got
    finally:
        await server.stop(grace=None)
