"""An Anthropic Messages request, translated to an OpenAI chat completions body. Pure: no
I/O; raises `Unsupported` (a 400 naming the field) for what it cannot translate.

Translated: `system` (a string or text blocks), `messages` (text, image with a base64 or
url source, tool_use, tool_result; a `system` turn, as Claude Code sends, becomes a chat
system message at its place), `tools` (custom tools: name, description,
input_schema), `tool_choice` (auto, any, tool, none; `disable_parallel_tool_use`),
`max_tokens` (required), `stop_sequences`, `temperature`, `top_p`, `top_k` (passed on as
an extra field, which vLLM and SGLang read), `metadata.user_id` (-> `user`), `stream`.
Ignored: `cache_control` on blocks, `thinking` (and thinking blocks in history),
`service_tier`, other unknown fields. Refused (400): document and other block kinds,
server tools (a `type` other than "custom"), `mcp_servers`, `container`.
"""

from __future__ import annotations

from typing import Any

import orjson

REFUSED_FIELDS = ("mcp_servers", "container")
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
_IGNORED_BLOCKS = frozenset({"thinking", "redacted_thinking"})
# The image types Anthropic's API accepts; anything else would be spliced into a data URL.
IMAGE_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})


class Unsupported(ValueError):
    """A request the translation refuses: its message and the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def to_chat(body: dict[str, Any], *, count_only: bool = False) -> dict[str, Any]:
    """The chat completions body of the Messages request `body` (`count_only`: a
    count_tokens request, which has no `max_tokens`)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise Unsupported("model: field required (a non-empty string)", "model")
    for name in REFUSED_FIELDS:
        if body.get(name) is not None:
            raise Unsupported(f"{name}: not supported by this gateway", name)
    chat: dict[str, Any] = {"model": model}
    messages = _system(body.get("system"))
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise Unsupported("messages: field required (a non-empty array)", "messages")
    for i, message in enumerate(raw):
        messages.extend(_message(message, i))
    chat["messages"] = messages
    if not count_only:
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            raise Unsupported("max_tokens: field required", "max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise Unsupported("max_tokens: must be a positive integer", "max_tokens")
        chat["max_tokens"] = max_tokens
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise Unsupported("tools: must be an array", "tools")
        if tools:
            chat["tools"] = [_tool(tool, i) for i, tool in enumerate(tools)]
    choice = body.get("tool_choice")
    if choice is not None:
        chat.update(_tool_choice(choice))
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise Unsupported("stop_sequences: must be an array of strings", "stop_sequences")
        if stops:
            chat["stop"] = stops
    for name in ("temperature", "top_p", "top_k"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Unsupported(f"{name}: must be a number", name)
        chat[name] = value
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        chat["user"] = metadata["user_id"]
    stream = body.get("stream")
    if stream is not None:
        if not isinstance(stream, bool):
            raise Unsupported("stream: must be a boolean", "stream")
        chat["stream"] = stream
    if "slotgate" in body:  # the gateway's own options (queue events)
        chat["slotgate"] = body["slotgate"]
    return chat


def _system(system: object, where: str = "system") -> list[dict[str, Any]]:
    """The chat system message of `system` (the top-level field, or a system turn's
    content at `where`): a string or text blocks."""
    param = where.split(".", 1)[0]
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if isinstance(system, list):
        texts = []
        for i, block in enumerate(system):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(
                    block.get("text"), str):
                raise Unsupported(f"{where}.{i}: only text blocks are supported", param)
            texts.append(block["text"])
        return [{"role": "system", "content": "\n".join(texts)}] if texts else []
    raise Unsupported(f"{where}: must be a string or an array of text blocks", param)


def _message(message: object, i: int) -> list[dict[str, Any]]:
    where = f"messages.{i}"
    if not isinstance(message, dict):
        raise Unsupported(f"{where}: must be an object", "messages")
    role = message.get("role")
    if role == "system":  # a system turn at its place (the mid-conversation-system beta)
        return _system(message.get("content"), f"{where}.content")
    if role not in ("user", "assistant"):
        raise Unsupported(f"{where}.role: must be 'user', 'assistant' or 'system'",
                          "messages")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise Unsupported(f"{where}.content: must be a string or an array of blocks",
                          "messages")
    if role == "assistant":
        return [_assistant(content, where)]
    return _user(content, where)


def _blocks(content: list[Any], where: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise Unsupported(f"{where}.content.{j}: must be a block with a 'type'", "messages")
        out.append((f"{where}.content.{j}", block))
    return out


def _text(block: dict[str, Any], at: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise Unsupported(f"{at}.text: must be a string", "messages")
    return text


def _assistant(content: list[Any], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for at, block in _blocks(content, where):
        kind = block["type"]
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_use":
            name, call_id, args = block.get("name"), block.get("id"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise Unsupported(f"{at}: tool_use needs a string 'id' and 'name'", "messages")
            calls.append({"id": call_id, "type": "function", "function": {
                "name": name, "arguments": orjson.dumps(args).decode()}})
        elif kind not in _IGNORED_BLOCKS:
            raise Unsupported(f"{at}: '{kind}' blocks are not supported in assistant turns",
                              "messages")
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        out["tool_calls"] = calls
    elif out["content"] is None:
        out["content"] = ""
    return out


def _user(content: list[Any], where: str) -> list[dict[str, Any]]:
    """Tool results first (as `tool` messages, which must follow the assistant's calls),
    then the rest of the turn as one user message."""
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for at, block in _blocks(content, where):
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, at)})
        elif kind == "image":
            parts.append(_image(block, at))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise Unsupported(f"{at}.tool_use_id: must be a string", "messages")
            text, images = _result(block.get("content"), at)
            if block.get("is_error") is True:
                text = "Error: " + text
            results.append({"role": "tool", "tool_call_id": call_id, "content": text})
            parts.extend(images)  # a chat tool message holds text only: images follow it
        elif kind not in _IGNORED_BLOCKS:
            raise Unsupported(f"{at}: '{kind}' blocks are not supported", "messages")
    if not parts:
        return results
    if len(parts) == 1 and parts[0]["type"] == "text":
        return [*results, {"role": "user", "content": parts[0]["text"]}]
    return [*results, {"role": "user", "content": parts}]


def _result(content: object, at: str) -> tuple[str, list[dict[str, Any]]]:
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise Unsupported(f"{at}.content: must be a string or an array of blocks", "messages")
    texts, images = [], []
    for inner, block in _blocks(content, at):
        if block["type"] == "text":
            texts.append(_text(block, inner))
        elif block["type"] == "image":
            images.append(_image(block, inner))
        else:
            raise Unsupported(f"{inner}: '{block['type']}' blocks are not supported in "
                              "tool results", "messages")
    return "\n".join(texts), images


def _image(block: dict[str, Any], at: str) -> dict[str, Any]:
    source = block.get("source")
    if isinstance(source, dict):
        if source.get("type") == "base64" and isinstance(source.get("data"), str) and \
                isinstance(source.get("media_type"), str):
            if source["media_type"] not in IMAGE_MEDIA_TYPES:  # spliced into a data URL
                raise Unsupported(f"{at}.source.media_type: must be one of "
                                  f"{', '.join(sorted(IMAGE_MEDIA_TYPES))}", "messages")
            url = f"data:{source['media_type']};base64,{source['data']}"
            return {"type": "image_url", "image_url": {"url": url}}
        if source.get("type") == "url" and isinstance(source.get("url"), str):
            return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise Unsupported(f"{at}.source: an image needs a base64 or url source", "messages")


def _tool(tool: object, i: int) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise Unsupported(f"tools.{i}: must be an object", "tools")
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise Unsupported(f"tools.{i}: server tool '{kind}' is not supported (custom tools "
                          "only)", "tools")
    name, schema = tool.get("name"), tool.get("input_schema")
    if not isinstance(name, str) or not name:
        raise Unsupported(f"tools.{i}.name: field required", "tools")
    if not isinstance(schema, dict):
        raise Unsupported(f"tools.{i}.input_schema: field required (an object)", "tools")
    function: dict[str, Any] = {"name": name, "parameters": schema}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: object) -> dict[str, Any]:
    if not isinstance(choice, dict) or not isinstance(choice.get("type"), str):
        raise Unsupported("tool_choice: must be an object with a 'type'", "tool_choice")
    kind = choice["type"]
    out: dict[str, Any] = {}
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise Unsupported("tool_choice.name: field required", "tool_choice")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif kind in _CHOICES:
        out["tool_choice"] = _CHOICES[kind]
    else:
        raise Unsupported(f"tool_choice.type: '{kind}' is not one of auto, any, tool, none",
                          "tool_choice")
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out
