"""An engine's chat completion stream, translated event by event to Anthropic's stream:
message_start, then per content block content_block_start / content_block_delta
(text_delta, input_json_delta) / content_block_stop, then message_delta (stop reason,
usage) and message_stop. Pure: bytes in, bytes out; the engine's usage goes to `usage`.
"""

from __future__ import annotations

from typing import Any

import orjson

from router.apis.anthropic_answer import stop_reason
from router.apis.chunks import ChunkTranslator
from router.common.usage import Usage


def event(name: str, data: dict[str, Any]) -> bytes:
    """One named SSE event."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


PING = event("ping", {"type": "ping"})


class MessageStream(ChunkTranslator):
    """Feed chat SSE bytes in; get back the Anthropic events to send (router.common.sse's relay
    shape). Only the first choice is translated."""

    __slots__ = ("_block", "_done", "_finish", "_index", "_input_estimate", "_matched",
                 "_message_id", "_model", "_produced", "_tool", "usage")

    def __init__(self, message_id: str, model: str, usage: Usage,
                 input_estimate: int = 0) -> None:
        self._message_id, self._model, self.usage = message_id, model, usage
        self._input_estimate = input_estimate
        super().__init__()
        self._produced = 0  # chunks that carried text or a tool call: tokens, about
        self._done = False
        self._block: str | None = None  # the open block's kind: "text" or "tool_use"
        self._index = -1  # the open (or last) block's index
        self._tool: object = None  # the engine's index of the open tool call
        self._finish: object = None
        self._matched: object = None

    def _start(self) -> bytes:
        self._started = True
        return event("message_start", {"type": "message_start", "message": {
            "id": self._message_id, "type": "message", "role": "assistant",
            "model": self._model, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self._input_estimate, "output_tokens": 0}}})

    def _choice(self, choice: dict[str, Any]) -> bytes:
        out: list[bytes] = []
        delta = choice.get("delta")
        if isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls")):
            self._produced += 1
        if isinstance(delta, dict):
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self._block != "text":
                    out.append(self._open({"type": "text", "text": ""}, "text"))
                out.append(self._delta({"type": "text_delta", "text": text}))
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    out.append(self._call(call))
        if choice.get("finish_reason") is not None:
            self._finish, self._matched = choice["finish_reason"], choice.get("stop_reason")
        return b"".join(out)

    def _call(self, call: dict[str, Any]) -> bytes:
        out = []
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        index = call.get("index", 0)
        if self._block != "tool_use" or index != self._tool:
            self._tool = index
            out.append(self._open({"type": "tool_use",
                                   "id": str(call.get("id") or f"toolu_{self._index + 1}"),
                                   "name": str(function.get("name") or ""), "input": {}},
                                  "tool_use"))
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            out.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return b"".join(out)

    def _open(self, block: dict[str, Any], kind: str) -> bytes:
        closed = self._close()
        self._index += 1
        self._block = kind
        return closed + event("content_block_start", {
            "type": "content_block_start", "index": self._index, "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta",
                                             "index": self._index, "delta": delta})

    def _close(self) -> bytes:
        if self._block is None:
            return b""
        self._block = None
        return event("content_block_stop", {"type": "content_block_stop",
                                            "index": self._index})

    def _end(self) -> bytes:
        if self._done:
            return b""
        self._done = True
        reason, sequence = stop_reason(self._finish, self._matched)
        usage = self.usage
        # Without the engine's usage: the chunks that carried output (not the role's or
        # the finish's), one token each, as engines stream them.
        output = usage.completion_tokens if usage.known else self._produced
        counts = {"output_tokens": output}
        if usage.known:
            counts["input_tokens"] = usage.prompt_tokens
        return b"".join((
            self._close(),
            event("message_delta", {"type": "message_delta", "delta": {
                "stop_reason": reason, "stop_sequence": sequence}, "usage": counts}),
            event("message_stop", {"type": "message_stop"})))
