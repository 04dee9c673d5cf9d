"""The simulated engine's tool calls: given `tools` (and a `tool_choice` other than
"none"), it calls one, deterministically: the named tool, else the first, with arguments
built from its schema's required properties. With `tool_choice` auto (or none given) it
answers in text instead once the conversation ends with a tool result, so that a tool
round trip ends. The arguments stream as tool_call deltas, one piece per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

_VALUES: dict[str, object] = {"string": "x", "integer": 1, "number": 1.5, "boolean": True,
                              "array": [], "object": {}, "null": None}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """The call the engine will answer with."""

    name: str
    arguments: str  # JSON text


def tool_call(body: dict[str, Any]) -> ToolCall | None:
    """The call a chat request's `tools` and `tool_choice` lead to; None: a text answer."""
    tools = [t["function"] for t in body.get("tools") or ()
             if isinstance(t, dict) and isinstance(t.get("function"), dict)
             and isinstance(t["function"].get("name"), str)]
    choice = body.get("tool_choice", "auto")
    if not tools or choice == "none":
        return None
    chosen = tools[0]
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        named = choice["function"].get("name")
        chosen = next((t for t in tools if t["name"] == named), chosen)
    elif choice != "required":
        messages = body.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else None
        if isinstance(last, dict) and last.get("role") == "tool":
            return None
    return ToolCall(chosen["name"], orjson.dumps(arguments(chosen.get("parameters"))).decode())


def arguments(schema: object) -> dict[str, object]:
    """A value for each required property of a JSON schema: its first enum value, else
    one of its type (a string is "x")."""
    if not isinstance(schema, dict):
        return {}
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    out: dict[str, object] = {}
    required = schema.get("required")
    for name in required if isinstance(required, list) else ():
        if not isinstance(name, str):
            continue
        spec = properties.get(name)
        if isinstance(spec, dict) and isinstance(spec.get("enum"), list) and spec["enum"]:
            out[name] = spec["enum"][0]
        elif isinstance(spec, dict) and isinstance(spec.get("type"), str):
            out[name] = _VALUES.get(spec["type"], "x")
        else:
            out[name] = "x"
    return out


def pieces(arguments: str, tokens: int) -> list[str]:
    """`arguments` cut into `tokens` pieces (fewer for short arguments), in order."""
    count = max(1, min(tokens, len(arguments)))
    size, extra = divmod(len(arguments), count)
    out, at = [], 0
    for i in range(count):
        end = at + size + (1 if i < extra else 0)
        out.append(arguments[at:end])
        at = end
    return out


def chunk(rid: str, created: int, model: str, call: ToolCall, call_id: str, piece: str,
          first: bool, finish: str | None, include_usage: bool) -> bytes:
    """One streamed chunk of the call: the first names it, each carries a piece."""
    function: dict[str, object] = {"arguments": piece}
    delta: dict[str, object] = {"tool_calls": [{"index": 0, "function": function}]}
    if first:
        delta["role"], delta["content"] = "assistant", None
        delta["tool_calls"] = [{"index": 0, "id": call_id, "type": "function",
                                "function": {"name": call.name, "arguments": piece}}]
    obj: dict[str, object] = {
        "id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    if include_usage:
        obj["usage"] = None
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def message(call: ToolCall, call_id: str, arguments: str) -> dict[str, object]:
    """The non-streamed answer's message."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function",
         "function": {"name": call.name, "arguments": arguments}}]}
