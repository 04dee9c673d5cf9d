"""The OTLP exporter a `tracing` section names (imported only when tracing is on): for
http/protobuf, `router.tracing.otlp_http`'s (the SDK's exporter's HTTP, without its
encoder's cost); for grpc, the SDK's."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from opentelemetry.sdk.trace.export import SpanExporter

from policies.config import TracingConfig
from router.tracing.otlp_http import OtlpHttpExporter
from router.tracing.wire import SpanEncoder

log = logging.getLogger("slotgate")
_MAX_HEADERS = 64


def grpc_exporter(config: TracingConfig) -> SpanExporter:
    """The SDK's OTLP/gRPC exporter, its headers from `headers_env` (never logged)."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )
    return GrpcExporter(endpoint=config.otlp_endpoint, headers=_headers(config.headers_env),
                        insecure=(config.otlp_endpoint or "").startswith("http://") or None)


def http_exporter(config: TracingConfig, resource: Mapping[str, Any],
                  scope: str) -> OtlpHttpExporter:
    """slotgate's OTLP/HTTP exporter, its headers from `headers_env` (never logged), else
    from the SDK's environment, as are the endpoint, timeout, compression and TLS files."""
    headers = _headers(config.headers_env)
    return OtlpHttpExporter(
        _endpoint(config.otlp_endpoint), SpanEncoder(resource, scope),
        headers if headers is not None else _headers_of(_env("HEADERS")),
        timeout_s=float(_env("TIMEOUT") or 10),
        gzip_body=(_env("COMPRESSION") or "none").strip().lower() == "gzip",
        ca_file=_env("CERTIFICATE"), client_cert=_env("CLIENT_CERTIFICATE"),
        client_key=_env("CLIENT_KEY"))


def _env(name: str) -> str | None:
    """OTEL_EXPORTER_OTLP_TRACES_{name}, else OTEL_EXPORTER_OTLP_{name} (the SDK's)."""
    return (os.environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}")
            or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}"))


def _endpoint(configured: str | None) -> str:
    """The configured endpoint (/v1/traces added to a bare host), else the SDK's env."""
    if configured is not None:
        if configured.rstrip("/").count("/") == 2:  # no path: the collector's usual one
            return configured.rstrip("/") + "/v1/traces"
        return configured
    signal = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if signal:
        return signal
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "http://localhost:4318"
    return base.rstrip("/") + "/v1/traces"


def _headers(env: str | None) -> dict[str, str] | None:
    """The headers `env` holds (None if it is not set)."""
    if env is None:
        return None
    raw = os.environ.get(env)
    if raw is None:
        log.warning("tracing.headers_env names %s, which is not set: no exporter headers",
                    env)
        return None
    return _headers_of(raw)


def _headers_of(raw: str | None) -> dict[str, str]:
    """`key=value,key2=value2` (values URL-encoded, as OTEL_EXPORTER_OTLP_HEADERS)."""
    if raw is None:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(",")[:_MAX_HEADERS]:
        key, sep, value = item.partition("=")
        if sep and key.strip():
            out[key.strip().lower()] = unquote(value.strip())
    return out
