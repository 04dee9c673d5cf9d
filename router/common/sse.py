"""SSE framing: cut an upstream byte stream into whole events, find usage, write comments.

Events are forwarded as soon as they are whole; only the events that carry a usage
object are parsed (most chunks are passed on without being decoded).
"""

from __future__ import annotations

import re

import orjson

from router.common.usage import Usage

_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_BOUNDARY = b"\n\n"
MAX_EVENT_BYTES = 4 * 1024 * 1024  # one upstream event larger than this is a broken upstream
# The headers of every event stream the gateway sends (answers, queue events, the console's
# live feed): never cached, never buffered by a proxy in front (nginx's X-Accel-Buffering).
SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


class EventTooLarge(Exception):
    """The upstream sent more than MAX_EVENT_BYTES without ending an event."""


class EventRelay:
    """Feed upstream bytes in; get back the bytes to send downstream.

    Whole events pass through untouched, except that the usage-only chunk the gateway
    asked for (`choices: []` plus `usage`) is removed when the client did not ask for it.
    """

    __slots__ = ("_pending", "strip_usage", "usage", "valid")

    def __init__(self, strip_usage: bool, usage: Usage) -> None:
        self._pending = b""
        self.strip_usage = strip_usage
        self.usage = usage
        self.valid = False  # an event whose data is a JSON object came (parsed until then)

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk if self._pending else chunk
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        end = data.rfind(_BOUNDARY)
        if end < 0:
            if len(data) > MAX_EVENT_BYTES:
                raise EventTooLarge
            self._pending = data
            return b""
        end += 2  # len(_BOUNDARY)
        whole, rest = data[:end], data[end:]
        self._pending = rest
        if rest and len(rest) > MAX_EVENT_BYTES:  # (usually none left: no call)
            raise EventTooLarge
        # Events start at `whole`'s first byte or after a blank line; JSON escapes newlines,
        # so a token's text cannot fake one.
        self.usage.seen_events += (whole.count(b"\n\ndata:") + whole.startswith(b"data:")
                                   - whole.count(b"data: [DONE]"))
        if not self.valid:
            self.valid = any(map(_is_object, _events(whole)))
        if _USAGE.search(whole) is None:
            return whole
        return b"".join(self._inspect(event) for event in _events(whole))

    def flush(self) -> bytes:
        """Whatever is left when the upstream ends (an unterminated last event)."""
        rest, self._pending = self._pending, b""
        if not self.valid and rest:
            self.valid = _is_object(rest)
        return rest

    def _inspect(self, event: bytes) -> bytes:
        if _USAGE.search(event) is None:
            return event
        payload = _data(event)
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return event
        if not isinstance(obj, dict):
            return event
        usage = obj.get("usage")
        if usage is None and isinstance(obj.get("response"), dict):  # a Responses event
            usage = obj["response"].get("usage")
        self.usage.update(usage)
        if self.strip_usage and obj.get("choices") == []:
            return b""
        return event


def _is_object(event: bytes) -> bool:
    """Is `event`'s data a JSON object (what every API's stream events are)?"""
    payload = _data(event)
    if not payload.startswith(b"{"):
        return False
    try:
        return isinstance(orjson.loads(payload), dict)
    except orjson.JSONDecodeError:
        return False


def _events(whole: bytes) -> list[bytes]:
    parts = whole.split(_BOUNDARY)
    return [part + _BOUNDARY for part in parts if part]


def _data(event: bytes) -> bytes:
    lines = [
        line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
    ]
    return b"\n".join(lines)


def comment(text: str) -> bytes:
    """An SSE comment line: every OpenAI SDK ignores it, proxies see traffic."""
    return b": " + text.encode() + b"\n\n"


def queue_frame(position: int, eta_s: float, pool: str, events: bool) -> bytes:
    """Where a waiting stream stands: a comment by default, a named event when asked."""
    ahead = max(0, position - 1)
    if not events:
        return comment(f"queue position={position} ahead={ahead} eta_s={eta_s:.1f}")
    data = {"position": position, "ahead": ahead, "eta_s": round(eta_s, 1), "pool": pool}
    return b"event: queue_status\ndata: " + orjson.dumps(data) + b"\n\n"


def start_frame(backend: str, reason: str | None, queue_wait_ms: float, events: bool,
                endpoint: str | None = None) -> bytes:
    """The slot is granted: the answer follows (`endpoint`: the group's replica)."""
    if not events:
        where = f" endpoint={endpoint}" if endpoint is not None else ""
        return comment(f"slot granted backend={backend}{where} reason={reason} "
                       f"queue_wait_ms={queue_wait_ms:.0f}")
    data: dict[str, object] = {"backend": backend, "reason": reason,
                               "queue_wait_ms": round(queue_wait_ms)}
    if endpoint is not None:
        data["endpoint"] = endpoint
    return b"event: start\ndata: " + orjson.dumps(data) + b"\n\n"
