"""The `tracing` section: OpenTelemetry traces of every request, exported over OTLP.

Pure data and validation: no YAML, no files, no environment lookups (`headers_env` names
the variable the gateway reads at startup; its value is a secret, never logged).
"""

from __future__ import annotations

import enum

from pydantic import Field

from policies.config.base import StrictModel


class OtlpProtocol(enum.StrEnum):
    HTTP = "http/protobuf"  # POST {endpoint}/v1/traces
    GRPC = "grpc"  # the collector's gRPC port (4317)


class TracingConfig(StrictModel):
    """Off by default: then no exporter exists and OpenTelemetry is never imported."""

    enabled: bool = False
    # The collector: http://host:4318 (http/protobuf; /v1/traces is appended when the
    # path is empty) or http://host:4317 (grpc). None: the SDK's OTEL_EXPORTER_OTLP_* env.
    otlp_endpoint: str | None = Field(default=None, pattern=r"^https?://", max_length=4096)
    protocol: OtlpProtocol = OtlpProtocol.HTTP
    service_name: str = Field(default="slotgate", min_length=1, max_length=256)
    sample_ratio: float = Field(default=1.0, ge=0, le=1)  # of the traces begun here
    # An environment variable holding the exporter's headers: key=value,key2=value2.
    headers_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
