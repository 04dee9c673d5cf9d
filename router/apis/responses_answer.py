"""An engine's chat completion, translated to a Responses API response object. Pure.

The output: one `message` item (its text as an `output_text` part) when the engine said
something, then one `function_call` item per tool call (a `custom_tool_call` for a custom
tool; a namespaced tool's call carries `namespace` and the tool's own `name`).
`finish_reason: length` makes the response `incomplete` (`max_output_tokens`); anything
else `completed`. The items are built by the same functions for the whole answer and
for the stream's events, so that a stream's `response.completed` carries what the whole
answer would have.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from router.apis.responses_tools import Called, custom_input


@dataclass(slots=True)
class Echo:
    """What a response object repeats of its request, and its ids."""

    response_id: str
    model: str
    created_at: int = field(default_factory=lambda: int(time.time()))
    request: dict[str, Any] = field(default_factory=dict)
    called: dict[str, Called] = field(default_factory=dict)  # engine name -> client's

    @property
    def message_id(self) -> str:
        return "msg_" + self.response_id.removeprefix("resp_")

    def call_id(self, index: int) -> str:
        """The id of the `index`th function_call item (not its call_id: the engine's)."""
        return f"fc_{self.response_id.removeprefix('resp_')}_{index}"


def message_item(echo: Echo, text: str, status: str = "completed") -> dict[str, Any]:
    content = ([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
               if status == "completed" else [])
    return {"type": "message", "id": echo.message_id, "status": status,
            "role": "assistant", "content": content}


def call_item(echo: Echo, index: int, call_id: str, name: str, arguments: str,
              status: str = "completed") -> dict[str, Any]:
    """The item of the engine's call of `name`, under the name the client gave the tool."""
    called = echo.called.get(name)
    if called is None:
        return {"type": "function_call", "id": echo.call_id(index), "call_id": call_id,
                "name": name, "arguments": arguments, "status": status}
    if called.custom:
        item = {"type": "custom_tool_call", "id": echo.call_id(index), "call_id": call_id,
                "name": called.name, "input": custom_input(arguments) if arguments else "",
                "status": status}
    else:
        item = {"type": "function_call", "id": echo.call_id(index), "call_id": call_id,
                "name": called.name, "arguments": arguments, "status": status}
    if called.namespace is not None:
        item["namespace"] = called.namespace
    return item


def call_done(item: dict[str, Any], arguments: str) -> dict[str, Any]:
    """An open call item (`call_item`'s) completed with the engine's whole `arguments`."""
    if item["type"] == "custom_tool_call":
        return {**item, "input": custom_input(arguments), "status": "completed"}
    return {**item, "arguments": arguments, "status": "completed"}


def response_object(echo: Echo, output: list[dict[str, Any]], status: str,
                    usage: dict[str, int] | None) -> dict[str, Any]:
    """The response object (`status`: in_progress, completed or incomplete)."""
    body = echo.request
    return {
        "id": echo.response_id, "object": "response", "created_at": echo.created_at,
        "status": status, "background": False, "error": None,
        "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete"
                               else None),
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"), "model": echo.model,
        "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": None, "store": False,
        "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "truncation": "disabled", "user": body.get("user"),
        "metadata": body.get("metadata") or {}, "usage": usage,
    }


def usage_of(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}}


def status_of(finish: object) -> str:
    return "incomplete" if finish == "length" else "completed"


def to_response(chat: object, echo: Echo, input_estimate: int = 0) -> dict[str, Any]:
    """The response object of the chat completion `chat` (its first choice)."""
    answer = chat if isinstance(chat, dict) else {}
    choices = answer.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(
        choices[0], dict) else {}
    message = _object(choice.get("message"))
    output: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        output.append(message_item(echo, text))
    for index, call in enumerate(message.get("tool_calls") or ()):
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            continue
        function: dict[str, Any] = call["function"]
        output.append(call_item(echo, index, str(call.get("id") or f"call_{index}"),
                                str(function.get("name") or ""),
                                arguments(function.get("arguments"))))
    usage = _object(answer.get("usage"))
    return response_object(echo, output, status_of(choice.get("finish_reason")),
                           usage_of(_count(usage.get("prompt_tokens"), input_estimate),
                                    _count(usage.get("completion_tokens"), 0)))


def arguments(value: object) -> str:
    """A tool call's arguments as the JSON string the Responses API carries."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode() if isinstance(value, dict) else "{}"


def _count(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
