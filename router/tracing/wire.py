"""OTLP trace protobuf written directly: the bytes of an `ExportTraceServiceRequest`.

The SDK's encoder builds a protobuf object per span, attribute and value, then serializes
them: most of tracing's cost. The gateway's spans have few fields and their attributes
repeat (route, backend, tenant, operation, status...), so this writes the wire format
itself: varints, length-delimited fields, fixed64 times, with the resource and scope
bytes written once and each repeating attribute's `KeyValue` bytes cached. Field numbers:
opentelemetry-proto's trace.proto, common.proto and resource.proto. Decoded, the output
equals the SDK's `encode_spans` message of the same spans as `ReadableSpan`s
(tests/test_tracing_wire.py holds them equal).

The spans are read from the gateway's finished traces (`router.tracing.spans`), under
the gateway's one resource and scope. The gateway never truncates attributes or events,
and writes no links: no dropped counts are written.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from router.tracing.spans import CLIENT, INTERNAL, SERVER, SpanFacts

_MAX_CACHED = 4096  # KeyValues kept; the table starts over when full
_SMALL = [bytes((n,)) for n in range(128)]
_DOUBLE = struct.Struct("<d").pack
# Span.flags (fixed32): the parent's is_remote is known (0x100), and true (0x200).
_LOCAL, _REMOTE = b"\x85\x01" + (0x100).to_bytes(4, "little"), \
    b"\x85\x01" + (0x300).to_bytes(4, "little")
_KINDS = {kind: b"\x30" + _SMALL[kind] for kind in (INTERNAL, SERVER, CLIENT)}
_TRUE, _FALSE = b"\x10\x01", b"\x10\x00"
_UNSET, _ERROR = b"\x7a\x00", b"\x7a\x02\x18\x02"  # Span.status: its code (2: ERROR)


class TraceLike(Protocol):
    """What the encoder reads of a finished trace (`router.tracing.spans.RequestTrace`)."""

    @property
    def trace_id(self) -> int: ...
    @property
    def state(self) -> str: ...  # the W3C `tracestate` header, "" for none
    def spans(self) -> Sequence[SpanFacts]: ...


def varint(n: int) -> bytes:
    """`n` (0 <= n < 2**64) as a protobuf varint."""
    if n < 0x80:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _delimited(tag: bytes, body: bytes) -> bytes:
    return tag + varint(len(body)) + body


def _text(tag: bytes, text: str) -> bytes:
    raw = text.encode()
    return tag + varint(len(raw)) + raw


def any_value(value: Any) -> bytes:
    """An `AnyValue` message (the SDK's attribute types)."""
    if isinstance(value, bool):
        return _TRUE if value else _FALSE
    if isinstance(value, str):
        return _text(b"\x0a", value)
    if isinstance(value, int):
        return b"\x18" + varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _delimited(b"\x3a", value)
    if value is None:
        return b""
    if isinstance(value, Sequence):
        return _delimited(b"\x2a", b"".join(_delimited(b"\x0a", any_value(v))
                                             for v in value))
    raise TypeError(f"no OTLP encoding for an attribute of type {type(value).__name__}")


class SpanEncoder:
    """Finished traces into request bytes, under one resource and one scope; holds the
    caches of what repeats between batches. Used by one exporter thread at a time (the
    BatchSpanProcessor's)."""

    def __init__(self, resource: Mapping[str, Any], scope: str) -> None:
        # (key, value): the KeyValue's length and bytes, a table per type (1 == 1.0 == True)
        self._strs: dict[tuple[str, str], bytes] = {}
        self._ints: dict[tuple[str, int], bytes] = {}
        self._keys: dict[str, bytes] = {}  # key: its KeyValue.key field
        self._names: dict[str, bytes] = {}  # span name: its Span.name field
        # ResourceSpans.resource and ScopeSpans.scope (field 1 of each), written once
        self._resource = _delimited(b"\x0a", b"".join(
            [b"\x0a" + self._kv(k, v) for k, v in resource.items()]))
        self._scope = _delimited(b"\x0a", _text(b"\x0a", scope) if scope else b"")

    def request(self, traces: Iterable[TraceLike]) -> bytes:
        """An `ExportTraceServiceRequest`: one ResourceSpans, one ScopeSpans, the traces'
        spans in order."""
        spans: list[bytes] = []
        for trace in traces:
            trace_id = b"\x0a\x10" + trace.trace_id.to_bytes(16, "big")
            state = _text(b"\x1a", trace.state) if trace.state else b""
            for span in trace.spans():
                one = self.span(trace_id, state, span)
                spans += (b"\x12", varint(len(one)), one)
        scope_spans = _delimited(b"\x12", self._scope + b"".join(spans))
        return _delimited(b"\x0a", self._resource + scope_spans)

    def _kv(self, key: str, value: Any) -> bytes:
        """A KeyValue's length and bytes; cached for the str and int values (not bool:
        True == 1), which repeat."""
        kind = type(value)
        cache = self._strs if kind is str else self._ints if kind is int else None
        if cache is not None:
            found = cache.get((key, value))
            if found is not None:
                return found
        head = self._keys.get(key)
        if head is None:
            if len(self._keys) >= _MAX_CACHED:
                self._keys.clear()
            head = self._keys[key] = _text(b"\x0a", key)
        kv = head + _delimited(b"\x12", any_value(value))
        kv = varint(len(kv)) + kv
        if cache is not None:
            if len(cache) >= _MAX_CACHED:
                cache.clear()
            cache[key, value] = kv
        return kv

    def _attributes(self, tag: bytes, attributes: Mapping[str, Any]) -> list[bytes]:
        """Each attribute's field: `tag`, then its KeyValue's length and bytes."""
        strs, ints, kv = self._strs, self._ints, self._kv
        out: list[bytes] = []
        for key, value in attributes.items():  # the cache hits looked up inline: most are
            kind = type(value)
            found = (strs.get((key, value)) if kind is str else
                     ints.get((key, value)) if kind is int else None)
            out += (tag, found or kv(key, value))
        return out

    def span(self, trace_id: bytes, state: bytes, span: SpanFacts) -> bytes:
        """One `Span` message (without its ScopeSpans tag and length); `trace_id` and
        `state` are its trace's fields, written."""
        name = self._names.get(span.name)
        if name is None:
            if len(self._names) >= _MAX_CACHED:
                self._names.clear()
            name = self._names[span.name] = _text(b"\x2a", span.name)
        out = [trace_id, b"\x12\x08", span.span_id.to_bytes(8, "big"), state]
        if span.parent_id is not None:
            out += (b"\x22\x08", span.parent_id.to_bytes(8, "big"))
        out += (name, _KINDS[span.kind], b"\x39", span.start_ns.to_bytes(8, "little"),
                b"\x41", span.end_ns.to_bytes(8, "little"))
        out += self._attributes(b"\x4a", span.attrs)
        for event in span.events:
            body = b"\x09" + event.time_ns.to_bytes(8, "little") + _text(b"\x12", event.name)
            body += b"".join(self._attributes(b"\x1a", event.attrs))
            out.append(_delimited(b"\x5a", body))
        out += (_ERROR if span.failed else _UNSET, _REMOTE if span.remote_parent else _LOCAL)
        return b"".join(out)
