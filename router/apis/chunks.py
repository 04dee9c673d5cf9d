"""The part every translated stream shares: an engine's chat SSE bytes cut into whole
events (bounded, as `router.sse` bounds them), each handed to the dialect's translation,
with its opening said before anything else and its ending after the engine's last event.
"""

from __future__ import annotations

from router.sse import MAX_EVENT_BYTES, EventTooLarge

_BOUNDARY = b"\n\n"


class ChunkTranslator:
    """Feed chat SSE bytes in, get the translated events out (router.sse's relay shape).
    A dialect's stream says what its opening (`_start`), each engine event (`_event`) and
    its ending (`_end`) become."""

    __slots__ = ("_pending", "_started")

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

    def _start(self) -> bytes:
        """The opening events; sets `_started`."""
        raise NotImplementedError

    def _event(self, raw: bytes) -> bytes:
        """One whole engine event (its lines, without the blank line that ends it)."""
        raise NotImplementedError

    def _end(self) -> bytes:
        raise NotImplementedError
