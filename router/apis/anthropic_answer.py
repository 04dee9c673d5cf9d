"""An engine's chat completion, translated to an Anthropic message. Pure: no I/O.

The stop reason: `stop` -> end_turn (stop_sequence when the engine names the matched stop
string, as vLLM does in `stop_reason`), `length` -> max_tokens, `tool_calls` -> tool_use.
Tool call arguments that are not a JSON object become an empty `input`.
"""

from __future__ import annotations

from typing import Any

import orjson

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "function_call": "tool_use", "content_filter": "end_turn"}


def stop_reason(finish: object, matched: object) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a chat choice's finish_reason and vLLM's stop_reason."""
    if finish == "stop" and isinstance(matched, str):
        return "stop_sequence", matched
    return STOP_REASONS.get(finish if isinstance(finish, str) else "stop", "end_turn"), None


def tool_input(arguments: object) -> dict[str, Any]:
    """A tool call's arguments (a JSON string) as the tool_use block's input object."""
    if isinstance(arguments, str):
        try:
            value = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}
    return arguments if isinstance(arguments, dict) else {}


def to_message(chat: object, message_id: str, model: str,
               input_estimate: int = 0) -> dict[str, Any]:
    """The Anthropic message of the chat completion `chat` (its first choice)."""
    answer = chat if isinstance(chat, dict) else {}
    choices = answer.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(
        choices[0], dict) else {}
    message = _object(choice.get("message"))
    content: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            continue
        function: dict[str, Any] = call["function"]
        content.append({"type": "tool_use", "id": str(call.get("id") or f"toolu_{len(content)}"),
                        "name": str(function.get("name") or ""),
                        "input": tool_input(function.get("arguments"))})
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"))
    usage = _object(answer.get("usage"))
    return {"id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": {"input_tokens": _count(usage.get("prompt_tokens"), input_estimate),
                      "output_tokens": _count(usage.get("completion_tokens"), 0)}}


def _count(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
