"""An engine's chat completion stream, translated event by event to the Responses API's
stream: response.created and response.in_progress; per output item
response.output_item.added, then for a message response.content_part.added,
response.output_text.delta..., response.output_text.done, response.content_part.done,
for a function call response.function_call_arguments.delta... and .done, and for a
custom tool's call one response.custom_tool_call_input.delta and .done (its input is
known once the engine's arguments are whole); then
response.output_item.done; at the end response.completed (or response.incomplete when
the engine stopped at max tokens) with the whole response. Every event carries its
`type` and a `sequence_number` from 0. Pure: bytes in, bytes out.
"""

from __future__ import annotations

from typing import Any

import orjson

from router.apis.chunks import ChunkTranslator
from router.apis.responses_answer import (
    Echo,
    call_done,
    call_item,
    message_item,
    response_object,
    status_of,
    usage_of,
)
from router.common.usage import Usage


class ResponseStream(ChunkTranslator):
    """Feed chat SSE bytes in; get back the Responses events to send (router.common.sse's relay
    shape). Only the first choice is translated."""

    __slots__ = ("_call", "_calls", "_done", "_echo", "_finish", "_input_estimate", "_item",
                 "_output", "_seq", "_text", "usage")

    def __init__(self, echo: Echo, usage: Usage, input_estimate: int = 0) -> None:
        self._echo, self.usage, self._input_estimate = echo, usage, input_estimate
        super().__init__()
        self._done = False
        self._seq = 0
        self._output: list[dict[str, Any]] = []  # the items done
        self._item: dict[str, Any] | None = None  # the open item
        self._text: list[str] = []  # the open message's text, or call's arguments
        self._call: object = None  # the engine's index of the open tool call
        self._calls = 0  # function calls opened
        self._finish: object = None

    def _emit(self, kind: str, data: dict[str, Any]) -> bytes:
        data = {"type": kind, **data, "sequence_number": self._seq}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _start(self) -> bytes:
        self._started = True
        response = response_object(self._echo, [], "in_progress", None)
        return (self._emit("response.created", {"response": response})
                + self._emit("response.in_progress", {"response": response}))

    def _choice(self, choice: dict[str, Any]) -> bytes:
        out: list[bytes] = []
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text = delta.get("content")
            if isinstance(text, str) and text:
                out.append(self._say(text))
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    out.append(self._tool(call))
        if choice.get("finish_reason") is not None:
            self._finish = choice["finish_reason"]
        return b"".join(out)

    def _say(self, text: str) -> bytes:
        out = b""
        if self._item is None or self._item["type"] != "message":
            out = self._close()
            item = self._open(message_item(self._echo, "", "in_progress"))
            out += item + self._emit("response.content_part.added", {
                **self._where(), "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}})
        self._text.append(text)
        return out + self._emit("response.output_text.delta", {
            **self._where(), "content_index": 0, "delta": text, "logprobs": []})

    def _tool(self, call: dict[str, Any]) -> bytes:
        out = b""
        function = call.get("function")
        if not isinstance(function, dict):
            function = {}
        index = call.get("index", 0)
        if self._item is None or self._item["type"] == "message" or index != self._call:
            out = self._close()
            self._call = index
            out += self._open(call_item(
                self._echo, self._calls, str(call.get("id") or f"call_{self._calls}"),
                str(function.get("name") or ""), "", "in_progress"))
            self._calls += 1
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self._text.append(arguments)
            if self._item is not None and self._item["type"] == "function_call":
                # (a custom tool's input is said whole, at its end)
                out += self._emit("response.function_call_arguments.delta",
                                  {**self._where(), "delta": arguments})
        return out

    def _where(self) -> dict[str, Any]:
        assert self._item is not None
        return {"item_id": self._item["id"], "output_index": len(self._output)}

    def _open(self, item: dict[str, Any]) -> bytes:
        self._item, self._text = item, []
        return self._emit("response.output_item.added",
                          {"output_index": len(self._output), "item": item})

    def _close(self) -> bytes:
        item = self._item
        if item is None:
            return b""
        text = "".join(self._text)
        where = self._where()
        if item["type"] == "message":
            done = message_item(self._echo, text)
            part = done["content"][0]
            out = (self._emit("response.output_text.done", {
                       **where, "content_index": 0, "text": text, "logprobs": []})
                   + self._emit("response.content_part.done",
                                {**where, "content_index": 0, "part": part}))
        elif item["type"] == "custom_tool_call":
            done = call_done(item, text)
            out = (self._emit("response.custom_tool_call_input.delta",
                              {**where, "delta": done["input"]})
                   + self._emit("response.custom_tool_call_input.done",
                                {**where, "input": done["input"]}))
        else:
            done = call_done(item, text)
            out = self._emit("response.function_call_arguments.done",
                             {**where, "name": item["name"], "arguments": text})
        out += self._emit("response.output_item.done",
                          {"output_index": where["output_index"], "item": done})
        self._output.append(done)
        self._item, self._text = None, []
        return out

    def _end(self) -> bytes:
        if self._done:
            return b""
        self._done = True
        out = self._close()
        usage = self.usage
        counts = (usage_of(usage.prompt_tokens, usage.completion_tokens) if usage.known
                  else usage_of(self._input_estimate, usage.seen_events))
        status = status_of(self._finish)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return out + self._emit(kind, {"response": response_object(
            self._echo, self._output, status, counts)})
