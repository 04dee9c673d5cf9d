"""OTLP/HTTP protobuf span exporter: `router.tracing.wire`'s bytes, POSTed to /v1/traces.

A `SpanExporter`, so the SDK's BatchSpanProcessor still batches and calls it on its own
thread. Its HTTP is the SDK exporter's where it matters: `Content-Type:
application/x-protobuf`, the configured headers, one deadline per export (10 s), retries
with exponential backoff (jittered, or the collector's `Retry-After`) on 429, 502, 503,
504 and connection errors, gzip if asked (off by default). One persistent connection; a
stale one is reopened and the export sent again at once.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import random
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from router.tracing.wire import SpanEncoder, TraceLike

log = logging.getLogger("slotgate")
_RETRYABLE = frozenset({429, 502, 503, 504})
_MAX_ATTEMPTS = 6
_MAX_RETRY_AFTER_S = 60.0


class OtlpHttpExporter(SpanExporter):
    """Spans to `endpoint` (a full URL, /v1/traces included) over one kept-alive
    connection; used by the processor's thread alone (shutdown aside)."""

    def __init__(self, endpoint: str, encoder: SpanEncoder,
                 headers: Mapping[str, str] | None = None,
                 timeout_s: float = 10.0, gzip_body: bool = False,
                 ca_file: str | None = None, client_cert: str | None = None,
                 client_key: str | None = None) -> None:
        url = urlsplit(endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"OTLP endpoint {endpoint!r}: expected http(s)://host[:port]/path")
        self._https = url.scheme == "https"
        self._host, self._port = url.hostname, url.port
        self._path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        self._context = ssl.create_default_context(cafile=ca_file) if self._https else None
        if self._context is not None and client_cert is not None:  # mTLS
            self._context.load_cert_chain(client_cert, client_key)
        self._headers = {"Content-Type": "application/x-protobuf",
                         "User-Agent": "slotgate-otlp", **(headers or {})}
        if gzip_body:
            self._headers["Content-Encoding"] = "gzip"
        self._gzip, self._timeout_s = gzip_body, timeout_s
        self._encoder = encoder
        self._conn: http.client.HTTPConnection | None = None
        self._stopped = threading.Event()

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        """Encode and send one batch of finished traces (`TraceLike`: what the processor
        is handed); FAILURE once the retries or the deadline run out."""
        if self._stopped.is_set():
            return SpanExportResult.FAILURE
        traces: Sequence[TraceLike] = spans
        body = self._encoder.request(traces)
        if self._gzip:
            body = gzip.compress(body, compresslevel=6)
        deadline = time.monotonic() + self._timeout_s
        for attempt in range(_MAX_ATTEMPTS):
            status, retry_after, problem = self._post(body, deadline)
            if 200 <= status < 400:
                return SpanExportResult.SUCCESS
            if status and status not in _RETRYABLE:
                break
            backoff = retry_after if retry_after is not None else \
                2 ** attempt * random.uniform(0.8, 1.2)
            if (attempt + 1 == _MAX_ATTEMPTS or backoff > deadline - time.monotonic()
                    or self._stopped.wait(backoff)):
                break
        log.warning("tracing: %d traces not exported (%s)", len(spans), problem)
        return SpanExportResult.FAILURE

    def _post(self, body: bytes, deadline: float) -> tuple[int, float | None, str]:
        """One POST (sent again at once on a fresh connection if the kept one had gone
        stale): the status (0: none came), the `Retry-After` seconds, what went wrong."""
        problem = ""
        for fresh in (self._conn is None, True):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return 0, None, problem or "deadline"
            try:
                conn = self._connection(remaining)
                conn.request("POST", self._path, body, self._headers)
                reply = conn.getresponse()
                reply.read()
            except (OSError, http.client.HTTPException) as exc:
                self._close()
                problem = f"{type(exc).__name__}: {exc}"
                if fresh:
                    break
                continue
            if reply.will_close:
                self._close()
            return reply.status, _seconds(reply.getheader("retry-after")), \
                f"HTTP {reply.status} {reply.reason}"
        return 0, None, problem

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        conn = self._conn
        if conn is None:
            conn = self._conn = (
                http.client.HTTPSConnection(self._host, self._port, context=self._context,
                                            timeout=timeout_s) if self._https else
                http.client.HTTPConnection(self._host, self._port, timeout=timeout_s))
        else:
            conn.timeout = timeout_s
            if conn.sock is not None:
                conn.sock.settimeout(timeout_s)
        return conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def shutdown(self) -> None:
        """Stop: a retry's wait ends, later batches are refused, the connection closes."""
        self._stopped.set()
        self._close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is held here (the processor holds the batches)."""
        return True


def _seconds(value: str | None) -> float | None:
    """A `Retry-After` in seconds (an HTTP date is ignored: the backoff applies)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return min(max(seconds, 0.0), _MAX_RETRY_AFTER_S) if seconds == seconds else None
