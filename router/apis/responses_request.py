"""An OpenAI Responses request, translated to a chat completions request. Pure: no I/O.

The stateless subset: `input` (a string, or message, function_call, function_call_output,
custom_tool_call and custom_tool_call_output items), `instructions` (the system message),
function, custom and namespace tools (router.apis.responses_tools), `tool_choice`,
`max_output_tokens`, `temperature`, `top_p`, `user`, `parallel_tool_calls`, `text.format`
(as `response_format`) and `stream`. What needs state kept by the server
(`previous_response_id`, `store: true`, `background`, `conversation`, stored prompts,
item references, `include`) is refused (`Unsupported`, the parameter named): it is served
only by a backend that speaks the Responses API itself. Hosted tools are dropped (named
in the `Chat` returned) or refused, as the route says. Reasoning items a client sends
back are dropped (a chat engine cannot read them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from router.apis.responses_tools import (
    Unsupported,
    chat_tools,
    custom_arguments,
    flat_name,
)

# Sampling parameters passed on under the same name.
_SAME = ("temperature", "top_p", "user", "parallel_tool_calls")
# Message roles as chat names them (a Responses `developer` message is a system one).
_ROLES = {"user": "user", "assistant": "assistant", "system": "system",
          "developer": "system"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})


@dataclass(slots=True)
class Chat:
    """The chat completions body, and the hosted tools left out of it."""

    body: dict[str, Any]
    dropped: list[str] = field(default_factory=list)


def stateful(body: dict[str, Any]) -> Unsupported | None:
    """The first feature of `body` that needs server-side state, refused."""
    checks = (("previous_response_id", body.get("previous_response_id") is not None),
              ("store", body.get("store") is True),
              ("background", body.get("background") is True),
              ("conversation", body.get("conversation") is not None),
              ("prompt", body.get("prompt") is not None),
              ("include", _includes_server_data(body.get("include"))))
    for param, used in checks:
        if used:
            return Unsupported(f"'{param}' needs state kept by the server, which this model's "
                               "backend does not keep (it is served by translation to chat "
                               "completions); send the whole conversation in 'input', "
                               "with 'store' unset or false.", param)
    return None


# What `include` may ask for without server state: reasoning to carry to the next request
# (Codex asks for it); a chat engine's answer has none, so nothing is added.
_STATELESS_INCLUDES = frozenset({"reasoning.encrypted_content"})


def _includes_server_data(include: object) -> bool:
    if not include:
        return False
    return not isinstance(include, list) or any(
        not isinstance(what, str) or what not in _STATELESS_INCLUDES for what in include)


def to_chat(body: dict[str, Any], refuse_hosted: bool = False) -> Chat:
    """The chat completions body of the Responses request `body` (`refuse_hosted`: a
    hosted tool is refused rather than dropped)."""
    refused = stateful(body)
    if refused is not None:
        raise refused
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    elif instructions is not None and not isinstance(instructions, str):
        raise Unsupported("'instructions' must be a string.", "instructions")
    source = body.get("input")
    if isinstance(source, str):
        messages.append({"role": "user", "content": source})
    elif isinstance(source, list):
        for i, item in enumerate(source):
            _item(item, i, messages)
    else:
        raise Unsupported("'input' is required: a string or an array of items.", "input")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for name in _SAME:
        if body.get(name) is not None:
            chat[name] = body[name]
    limit = body.get("max_output_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise Unsupported("'max_output_tokens' must be a positive integer.",
                              "max_output_tokens")
        chat["max_tokens"] = limit
    if body.get("stream") is not None:
        chat["stream"] = body["stream"]
    dropped: list[str] = []
    tools = body.get("tools")
    if tools:
        functions, dropped = chat_tools(_array(tools, "tools"), refuse_hosted)
        if functions:
            chat["tools"] = functions
    if body.get("tool_choice") is not None:
        choice = _tool_choice(body["tool_choice"])
        if "tools" in chat or not dropped:  # every tool dropped: nothing to choose from
            chat["tool_choice"] = choice
    if (fmt := _response_format(body.get("text"))) is not None:
        chat["response_format"] = fmt
    if body.get("slotgate") is not None:
        chat["slotgate"] = body["slotgate"]
    return Chat(chat, dropped)


def _item(item: object, i: int, messages: list[dict[str, Any]]) -> None:
    if not isinstance(item, dict):
        raise Unsupported(f"'input[{i}]' must be an object.", "input")
    kind = item.get("type", "message")
    if kind == "message":
        asked = item.get("role")
        role = _ROLES.get(asked) if isinstance(asked, str) else None
        if role is None:
            raise Unsupported(f"'input[{i}].role' must be user, assistant, system or "
                              "developer.", "input")
        messages.append({"role": role, "content": _content(item.get("content"), i, role)})
    elif kind in ("function_call", "custom_tool_call"):
        arguments = (_string(item.get("arguments"), "{}") if kind == "function_call"
                     else custom_arguments(item.get("input")))
        _call(messages, {"id": str(item.get("call_id") or item.get("id") or f"call_{i}"),
                         "type": "function",
                         "function": {"name": _called(item), "arguments": arguments}})
    elif kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        text = output if isinstance(output, str) else _text_of(output)
        messages.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                         "content": text})
    elif kind == "reasoning":
        return  # a previous answer's reasoning: nothing a chat engine can read
    else:
        raise Unsupported(f"'input[{i}]': items of type '{kind}' are not supported by "
                          "translation to chat completions.", "input")


def _called(item: dict[str, Any]) -> str:
    """The engine's name of the tool a call item names (a namespace's: flattened)."""
    name = str(item.get("name") or "")
    namespace = item.get("namespace")
    return flat_name(namespace, name) if isinstance(namespace, str) and namespace else name


def _call(messages: list[dict[str, Any]], call: dict[str, Any]) -> None:
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and "tool_calls" in last:
        last["tool_calls"].append(call)  # parallel calls: one assistant turn
    elif last is not None and last["role"] == "assistant" and isinstance(
            last.get("content"), str):
        last["tool_calls"] = [call]
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _content(content: object, i: int, role: str) -> Any:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in _array(content, "input"):
        if not isinstance(part, dict):
            raise Unsupported(f"'input[{i}].content' holds a part that is not an object.",
                              "input")
        kind = part.get("type")
        if isinstance(kind, str) and kind in _TEXT_PARTS:
            text = part.get("text", part.get("refusal"))
            parts.append({"type": "text", "text": text if isinstance(text, str) else ""})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            image: dict[str, Any] = {"url": part["image_url"]}
            if isinstance(part.get("detail"), str):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise Unsupported(f"'input[{i}].content': parts of type '{kind}' are not "
                              "supported by translation (file ids need server state).",
                              "input")
    if role != "user" and all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)  # assistant and system: a string
    return parts


def _tool_choice(choice: object) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
        return {"type": "function", "function": {"name": _called(choice)}}
    raise Unsupported("'tool_choice' must be auto, none, required or a function or custom "
                      "tool ({\"type\": \"function\", \"name\": ...}).", "tool_choice")


def _response_format(text: object) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise Unsupported("'text.format.type' must be text, json_object or json_schema.", "text")


def _text_of(parts: object) -> str:
    if not isinstance(parts, list):
        return ""
    return "".join(part["text"] for part in parts
                   if isinstance(part, dict) and isinstance(part.get("text"), str))


def _array(value: object, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise Unsupported(f"'{param}' must be an array.", param)
    return value


def _string(value: object, default: str) -> str:
    return value if isinstance(value, str) else default
