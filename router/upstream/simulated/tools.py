"""The simulated engine's tool calls, made like a model in an agent's loop, and always the
same for the same request (whatever the seed):

- `tool_choice` "none": text. A named tool, or "required": that tool, or the pick below.
- `tool_choice` "auto" (or none given): a call only while the current turn (the messages
  after the last assistant message) holds no tool result; once a result is there, text,
  so that every tool round trip ends. System turns and the user text a client adds beside
  a result (Claude Code's reminders) do not open a new turn.
- The pick: the first shell tool offered (`SHELLS`, e.g. Claude Code's Bash, Codex's
  exec_command), else the first tool. Arguments: each required property of the schema,
  its first enum value, else a value of its type ("x" for a string), and for a property
  named `command` or `cmd` the harmless `echo slotgate-simulated` (a string, or an argv
  array), so that a real agent can run the call.

The arguments stream as tool_call deltas, one piece per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

# Tool names of shells that agents offer, in order of preference (lower case).
SHELLS = ("bash", "exec_command", "shell", "shell_command", "local_shell", "run_shell_command")
ECHO = "echo slotgate-simulated"
_COMMANDS = frozenset({"command", "cmd"})
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
    chosen = pick(tools)
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        named = choice["function"].get("name")
        chosen = next((t for t in tools if t["name"] == named), chosen)
    elif choice != "required" and answered(body.get("messages")):
        return None
    return ToolCall(chosen["name"], orjson.dumps(arguments(chosen.get("parameters"))).decode())


def pick(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The first shell tool offered, else the first tool."""
    names = {t["name"].lower(): t for t in reversed(tools)}  # the first of a name wins
    return next((names[shell] for shell in SHELLS if shell in names), tools[0])


def answered(messages: object) -> bool:
    """Does the current turn (after the last assistant message) hold a tool result?"""
    if not isinstance(messages, list):
        return False
    for message in reversed(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "tool":
            return True
        if role == "assistant":
            return False
    return False


def arguments(schema: object) -> dict[str, object]:
    """A value for each required property of a JSON schema: its first enum value, else
    one of its type (a string is "x"); a `command` or `cmd` runs `echo`."""
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
        kind = spec.get("type") if isinstance(spec, dict) else None
        if name in _COMMANDS and kind in ("string", "array", None):
            out[name] = ["bash", "-lc", ECHO] if kind == "array" else ECHO
        elif isinstance(spec, dict) and isinstance(spec.get("enum"), list) and spec["enum"]:
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
