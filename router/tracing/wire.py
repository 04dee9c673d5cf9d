"""OTLP trace protobuf written directly: the bytes of an `ExportTraceServiceRequest`.

The SDK's encoder builds a protobuf object per span, attribute and value, then serializes
them: most of tracing's cost. The gateway's spans have few fields and their attributes
repeat (route, backend, tenant, operation, status...), so this writes the wire format
itself: varints, length-delimited fields, fixed64 times, with the resource and scope
bytes written once and each repeating attribute's `KeyValue` bytes cached. Field numbers:
opentelemetry-proto's trace.proto, common.proto and resource.proto. Decoded, the output
equals the SDK's `encode_spans` message (tests/test_tracing_wire.py holds them equal).

A span is read through what `ReadableSpan` exposes (name, context, parent, kind, times,
attributes, events, links, status, resource, instrumentation_scope). The gateway never
truncates attributes, events or links: no dropped counts are written.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status

_MAX_CACHED = 4096  # KeyValues kept; the table starts over when full
_SMALL = [bytes((n,)) for n in range(128)]
_DOUBLE = struct.Struct("<d").pack
# Span.flags (fixed32): the parent's is_remote is known (0x100), and true (0x200).
_LOCAL, _REMOTE = b"\x85\x01" + (0x100).to_bytes(4, "little"), \
    b"\x85\x01" + (0x300).to_bytes(4, "little")
_KINDS = {kind: b"\x30" + _SMALL[kind.value + 1] for kind in SpanKind}  # proto's = SDK's + 1
_TRUE, _FALSE = b"\x10\x01", b"\x10\x00"


class SpanLike(Protocol):
    """What the encoder reads of a span (`ReadableSpan`'s names)."""

    @property
    def name(self) -> str: ...
    @property
    def context(self) -> SpanContext | None: ...
    @property
    def parent(self) -> SpanContext | None: ...
    @property
    def kind(self) -> SpanKind: ...
    @property
    def start_time(self) -> int | None: ...
    @property
    def end_time(self) -> int | None: ...
    @property
    def attributes(self) -> Mapping[str, Any] | None: ...
    @property
    def events(self) -> Sequence[Any]: ...
    @property
    def links(self) -> Sequence[Any]: ...
    @property
    def status(self) -> Status: ...
    @property
    def resource(self) -> Resource: ...
    @property
    def instrumentation_scope(self) -> InstrumentationScope | None: ...


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
    """Spans into request bytes; holds the caches of what repeats between batches.

    Used by one exporter thread at a time (the BatchSpanProcessor's)."""

    def __init__(self) -> None:
        # (key, value): the KeyValue's length and bytes, a table per type (1 == 1.0 == True)
        self._strs: dict[tuple[str, str], bytes] = {}
        self._ints: dict[tuple[str, int], bytes] = {}
        self._keys: dict[str, bytes] = {}  # key: its KeyValue.key field
        # (id(resource), id(scope)): both (held, so the ids stay theirs) and their fields
        self._heads: dict[tuple[int, int], tuple[Any, Any, bytes, bytes]] = {}

    def request(self, spans: Iterable[SpanLike]) -> bytes:
        """An `ExportTraceServiceRequest`: one ResourceSpans per resource, one ScopeSpans
        per scope within it, in the order first seen (grouped by identity)."""
        tree: dict[int, dict[int, list[bytes]]] = {}
        heads = self._heads
        for span in spans:
            resource, scope = span.resource, span.instrumentation_scope
            at = (id(resource), id(scope))
            if at not in heads:
                if len(heads) >= 16:
                    heads.clear()
                heads[at] = (resource, scope, self._resource(resource), self._scope(scope))
            tree.setdefault(at[0], {}).setdefault(at[1], []).append(self.span(span))
        out = []
        for rid, scopes in tree.items():
            parts = []
            for sid, encoded in scopes.items():
                resource, scope, resource_field, scope_field = heads[rid, sid]
                body = scope_field + b"".join([b"\x12" + varint(len(one)) + one
                                               for one in encoded])
                if getattr(scope, "schema_url", ""):
                    body += _text(b"\x1a", scope.schema_url)
                parts.append(_delimited(b"\x12", body))
            body = resource_field + b"".join(parts)
            if getattr(resource, "schema_url", ""):
                body += _text(b"\x1a", resource.schema_url)
            out.append(_delimited(b"\x0a", body))
        return b"".join(out)

    def _resource(self, resource: Resource) -> bytes:
        """ResourceSpans.resource (field 1), always present as in the SDK's."""
        return _delimited(b"\x0a", b"".join(
            [b"\x0a" + self._kv(k, v) for k, v in resource.attributes.items()]))

    def _scope(self, scope: InstrumentationScope | None) -> bytes:
        """ScopeSpans.scope (field 1), always present as in the SDK's."""
        if scope is None:
            return b"\x0a\x00"
        body = _text(b"\x0a", scope.name) if scope.name else b""
        if scope.version:
            body += _text(b"\x12", scope.version)
        body += b"".join([b"\x1a" + self._kv(k, v) for k, v in (scope.attributes or {}).items()])
        return _delimited(b"\x0a", body)

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

    def _attributes(self, tag: bytes, attributes: Mapping[str, Any] | None) -> list[bytes]:
        """Each attribute's field: `tag`, then its KeyValue's length and bytes."""
        if not attributes:
            return []
        strs, ints, kv = self._strs, self._ints, self._kv
        out: list[bytes] = []
        for key, value in attributes.items():  # the cache hits looked up inline: most are
            kind = type(value)
            found = (strs.get((key, value)) if kind is str else
                     ints.get((key, value)) if kind is int else None)
            out += (tag, found or kv(key, value))
        return out

    def span(self, span: SpanLike) -> bytes:
        """One `Span` message (without its ScopeSpans tag and length)."""
        context, parent = span.context, span.parent
        assert context is not None  # a finished span always has one
        out = [b"\x0a\x10", context.trace_id.to_bytes(16, "big"),
               b"\x12\x08", context.span_id.to_bytes(8, "big")]
        state = context.trace_state
        if state:
            out.append(_text(b"\x1a", state.to_header()))
        if parent is not None:
            out += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
        out += (_text(b"\x2a", span.name), _KINDS[span.kind],
                b"\x39", (span.start_time or 0).to_bytes(8, "little"),
                b"\x41", (span.end_time or 0).to_bytes(8, "little"))
        out += self._attributes(b"\x4a", span.attributes)
        for event in span.events:
            body = b"\x09" + event.timestamp.to_bytes(8, "little") + _text(b"\x12", event.name)
            body += b"".join(self._attributes(b"\x1a", event.attributes))
            out.append(_delimited(b"\x5a", body))
        for link in span.links:
            linked = link.context
            body = (b"\x0a\x10" + linked.trace_id.to_bytes(16, "big")
                    + b"\x12\x08" + linked.span_id.to_bytes(8, "big"))
            body += b"".join(self._attributes(b"\x22", link.attributes))
            body += b"\x35" + (0x300 if linked.is_remote else 0x100).to_bytes(4, "little")
            out.append(_delimited(b"\x6a", body))
        status = span.status
        code = status.status_code.value
        body = _text(b"\x12", status.description) if status.description else b""
        if code:
            body += b"\x18" + _SMALL[code]
        out += (_delimited(b"\x7a", body),
                _REMOTE if parent is not None and parent.is_remote else _LOCAL)
        return b"".join(out)
