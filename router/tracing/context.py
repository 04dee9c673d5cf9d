"""The W3C trace context a client sends beyond `traceparent`, bounded as its
specifications say: `tracestate` at 32 list members and 512 bytes (Trace Context,
section 3.3.1.1), `baggage` at 180 members and 8,192 bytes (Baggage, section 3.3.3).
A header past its bound is dropped whole, never parsed nor forwarded. Reads only.
"""

from __future__ import annotations

from collections.abc import Iterable

from multidict import CIMultiDictProxy

MAX_TRACESTATE_BYTES, MAX_TRACESTATE_MEMBERS = 512, 32
MAX_BAGGAGE_BYTES, MAX_BAGGAGE_MEMBERS = 8192, 180
_BOUNDS = {"tracestate": (MAX_TRACESTATE_BYTES, MAX_TRACESTATE_MEMBERS),
           "baggage": (MAX_BAGGAGE_BYTES, MAX_BAGGAGE_MEMBERS)}


def within(name: str, values: Iterable[str]) -> bool:
    """Whether the `name` header's `values` (several are one list, joined by commas) keep
    to its bounds; counted before any parse (a comma more than the members at most)."""
    max_bytes, max_members = _BOUNDS[name]
    size = members = 0
    for value in values:
        if size + len(value) > max_bytes:  # characters: at most its bytes
            return False
        size += (len(value) if value.isascii() else
                 len(value.encode("utf-8", "surrogateescape"))) + bool(members)
        members += value.count(",") + 1  # the joining comma counted in `size`
        if size > max_bytes or members > max_members:
            return False
    return True


def tracestate_within(headers: CIMultiDictProxy[str]) -> bool:
    """Whether the request's `tracestate` (if any) keeps to its bounds."""
    return within("tracestate", headers.getall("tracestate", []))


def bounded(headers: CIMultiDictProxy[str], out: list[tuple[str, str]]
            ) -> list[tuple[str, str]]:
    """`out` (headers forwarded from `headers`) without a `tracestate` or `baggage` past
    its bounds."""
    drop = {name for name in _BOUNDS
            if name in headers and not within(name, headers.getall(name))}
    return [(k, v) for k, v in out if k.lower() not in drop] if drop else out
