"""The text of one answer, kept for a shadow comparison (#33): the engine's bytes of a
sampled request are copied as they pass (a stream's events, or the whole answer once
parsed), up to MAX_BYTES, and read as text once the answer has ended. Only sampled
requests pay for it: others never meet this module. Never logged."""

from __future__ import annotations

from typing import Any

import orjson

from router.apis.dialect import Relay
from router.upstream.answers import answer_text

MAX_BYTES = 256 * 1024  # of a stream's events; a longer answer is judged on its start


class Capture:
    __slots__ = ("answer", "chunks", "size")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.answer: dict[str, Any] | None = None  # a whole answer, as parsed

    def add(self, chunk: bytes) -> None:
        if self.size < MAX_BYTES:
            self.chunks.append(chunk)
            self.size += len(chunk)

    def text(self) -> str:
        """The answer's text: a whole answer's choices, or a stream's deltas (OpenAI's chat
        and completions chunks, as engines send them)."""
        if self.answer is not None:
            return answer_text(self.answer)
        parts: list[str] = []
        for line in b"".join(self.chunks).splitlines():
            if not line.startswith(b"data:") or line.endswith(b"[DONE]"):
                continue
            try:
                event = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                continue  # (a last event cut at MAX_BYTES)
            for choice in event.get("choices") or () if isinstance(event, dict) else ():
                parts.append(_delta_text(choice))
        return "".join(parts)


def _delta_text(choice: object) -> str:
    if not isinstance(choice, dict):
        return ""
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return text if isinstance(text, str) else ""


class CapturingRelay:
    """A stream's relay that copies the engine's bytes into a Capture on their way in."""

    __slots__ = ("capture", "inner")

    def __init__(self, inner: Relay, capture: Capture) -> None:
        self.inner, self.capture = inner, capture

    def feed(self, chunk: bytes) -> bytes:
        self.capture.add(chunk)
        return self.inner.feed(chunk)

    def flush(self) -> bytes:
        return self.inner.flush()

    @property
    def valid(self) -> bool:
        return self.inner.valid
