"""The part every translated stream shares: an engine's chat SSE bytes cut into whole
events (bounded, as `router.common.sse` bounds them), each handed to the dialect's translation,
with its opening said before anything else and its ending after the engine's last event.
"""

from __future__ import annotations

from typing import Any

import orjson

from router.common.sse import MAX_EVENT_BYTES, EventTooLarge
from router.common.usage import Usage

_BOUNDARY = b"\n\n"


class ChunkTranslator:
    """Feed chat SSE bytes in, get the translated events out (router.common.sse's relay shape).
    A dialect's stream says what its opening (`_start`), the first choice of each engine
    chunk (`_choice`) and its ending (`_end`) become; the engine's usage goes to `usage`."""

    __slots__ = ("_pending", "_started")
    usage: Usage  # (the subclass's slots)
    _done: bool  # the ending was said: later chunks are ignored

    def __init__(self) -> None:
        self._pending = b""
        self._started = False

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk if self._pending else chunk
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        end = data.rfind(_BOUNDARY)
        if end < 0:
            if len(data) > MAX_EVENT_BYTES:
                raise EventTooLarge
            self._pending = data
            return self._start() if not self._started else b""
        whole, self._pending = data[:end], data[end + 2:]
        if len(self._pending) > MAX_EVENT_BYTES:
            raise EventTooLarge
        out = [self._start()] if not self._started else []
        for raw in whole.split(_BOUNDARY):
            out.append(self._event(raw))
        return b"".join(out)

    def flush(self) -> bytes:
        """The end of the engine's stream: an unterminated last event, then the end."""
        rest, self._pending = self._pending, b""
        out = [self._start()] if not self._started else []
        if rest.strip():
            out.append(self._event(rest))
        out.append(self._end())
        return b"".join(out)

    @property
    def valid(self) -> bool:
        """Has the engine sent one valid event (a JSON object) yet?"""
        return self.usage.seen_events > 0

    def _start(self) -> bytes:
        """The opening events; sets `_started`."""
        raise NotImplementedError

    def _event(self, raw: bytes) -> bytes:
        """One whole engine event (its lines, without the blank line that ends it)."""
        lines = [line[5:].removeprefix(b" ") for line in raw.split(b"\n")
                 if line.startswith(b"data:")]
        if not lines:
            return b""  # a comment or an empty event
        payload = b"\n".join(lines)
        if payload.strip() == b"[DONE]":
            return self._end()
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return b""
        if not isinstance(chunk, dict) or self._done:
            return b""
        self.usage.seen_events += 1
        if chunk.get("usage"):
            self.usage.update(chunk["usage"])
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return b""
        return self._choice(choices[0])

    def _choice(self, choice: dict[str, Any]) -> bytes:
        """The first choice of one engine chunk."""
        raise NotImplementedError

    def _end(self) -> bytes:
        raise NotImplementedError
