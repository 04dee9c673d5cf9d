"""The OTLP exporter a `tracing` section names (imported only when tracing is on)."""

from __future__ import annotations

import logging
import os
from urllib.parse import unquote

from opentelemetry.sdk.trace.export import SpanExporter

from policies.config import OtlpProtocol, TracingConfig

log = logging.getLogger("slotgate")
_MAX_HEADERS = 64


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
