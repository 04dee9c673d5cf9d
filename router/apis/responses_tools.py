"""A Responses request's tools, as a chat engine sees them, and the way back. Pure: no I/O.

- `function` tools pass as chat function tools.
- `namespace` tools (a named group of function and custom tools, as Codex sends) are
  flattened: each member becomes a chat function named `<namespace>__<name>` (Codex's own
  flat form), and a call to it comes back as a `function_call` (or `custom_tool_call`)
  item with `namespace` and the member's own `name`, the way the Responses API gives it.
- `custom` tools (free-form input, optionally under a grammar) become a chat function
  with one string parameter, `input`; a call comes back as a `custom_tool_call` item
  whose `input` is that string.
- hosted tools (`web_search`, `file_search`, `code_interpreter`...: run by the server,
  which here is a chat engine that cannot) are dropped and named, or refused: the
  route's `responses.hosted_tools` decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

# Tool types the Responses API runs on the server (or, like local_shell, whose calls are
# items a chat engine cannot produce); dated variants (`web_search_preview_2025_03_11`)
# match by prefix.
HOSTED = ("web_search", "web_search_preview", "file_search", "code_interpreter",
          "computer_use", "computer_use_preview", "computer", "image_generation", "mcp",
          "local_shell", "shell", "apply_patch", "tool_search")
_CUSTOM_PARAMETERS = {"type": "object", "required": ["input"], "additionalProperties": False,
                      "properties": {"input": {"type": "string",
                                               "description": "The tool's whole input."}}}


class Unsupported(Exception):
    """A request the translation cannot carry: `param` names what the client sent."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True, slots=True)
class Called:
    """What the client named a tool that the engine knows by a flat name."""

    namespace: str | None
    name: str
    custom: bool  # a custom tool: its call carries `input`, not `arguments`


def hosted(kind: str) -> bool:
    return any(kind == base or kind.startswith(base + "_") for base in HOSTED)


def flat_name(namespace: str, name: str) -> str:
    """The engine's name of `name` in `namespace` (Codex's canonical flat form)."""
    return f"{namespace.rstrip('_')}__{name.lstrip('_')}"


def chat_tools(tools: list[Any], refuse_hosted: bool) -> tuple[list[dict[str, Any]],
                                                              list[str]]:
    """The chat tools of a Responses request's `tools`, and the hosted tool types dropped
    (in order, once each); refused (`Unsupported`) instead when `refuse_hosted`."""
    out: list[dict[str, Any]] = []
    dropped: list[str] = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in ("function", "custom"):
            out.append(_member(tool, None, f"tools[{i}]"))
        elif kind == "namespace":
            namespace = tool.get("name")
            members = tool.get("tools")
            if not isinstance(namespace, str) or not namespace or not isinstance(members, list):
                raise Unsupported(f"'tools[{i}]': a namespace tool needs a 'name' and an "
                                  "array of 'tools'.", "tools")
            out.extend(_member(member, namespace, f"tools[{i}].tools[{j}]")
                       for j, member in enumerate(members))
        elif isinstance(kind, str) and hosted(kind):
            if refuse_hosted:
                raise Unsupported(f"'tools[{i}]': '{kind}' is a tool the server runs, and "
                                  "this model's engine cannot (it is served by translation "
                                  "to chat completions); leave it out, or ask the operator "
                                  "to drop such tools on this route (responses.hosted_tools: "
                                  "drop).", "tools")
            if kind not in dropped:
                dropped.append(kind)
        else:
            raise Unsupported(f"'tools[{i}]': tools of type '{kind}' are not supported by "
                              "translation to chat completions (function, custom and "
                              "namespace tools are).", "tools")
    names = [tool["function"]["name"] for tool in out]
    if len(set(names)) != len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise Unsupported(f"'tools': two tools are named '{twice}' (a namespace's tools are "
                          "named '<namespace>__<name>' for the engine).", "tools")
    return out, dropped


def _member(tool: object, namespace: str | None, where: str) -> dict[str, Any]:
    kind = tool.get("type") if isinstance(tool, dict) else None
    name = tool.get("name") if isinstance(tool, dict) else None
    if kind not in ("function", "custom") or not isinstance(name, str) or not name:
        raise Unsupported(f"'{where}' must be a function or custom tool with a 'name' "
                          f"(not '{kind}').", "tools")
    assert isinstance(tool, dict)
    function: dict[str, Any] = {"name": flat_name(namespace, name) if namespace else name}
    description = tool.get("description")
    if kind == "custom":
        function["description"] = _custom_description(description, tool.get("format"))
        function["parameters"] = _CUSTOM_PARAMETERS
        return {"type": "function", "function": function}
    if isinstance(description, str) and description:
        function["description"] = description
    for field in ("parameters", "strict"):
        if tool.get(field) is not None:
            function[field] = tool[field]
    return {"type": "function", "function": function}


def _custom_description(description: object, fmt: object) -> str:
    text = description if isinstance(description, str) else ""
    if isinstance(fmt, dict) and fmt.get("type") == "grammar" and isinstance(
            fmt.get("definition"), str):
        syntax = fmt.get("syntax") if isinstance(fmt.get("syntax"), str) else "lark"
        text += (f"\n\nPut the tool's whole input in 'input'; it must follow this {syntax} "
                 f"grammar:\n{fmt['definition']}")
    return text.strip() or "A tool taking free-form text as its 'input'."


def tool_names(tools: object) -> dict[str, Called]:
    """The engine's names that a client knows otherwise: namespaced and custom tools."""
    out: dict[str, Called] = {}
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "custom" and isinstance(tool.get("name"), str):
            out[tool["name"]] = Called(None, tool["name"], True)
        elif tool.get("type") == "namespace" and isinstance(tool.get("name"), str):
            for member in tool.get("tools") or ():
                if isinstance(member, dict) and isinstance(member.get("name"), str):
                    out[flat_name(tool["name"], member["name"])] = Called(
                        tool["name"], member["name"], member.get("type") == "custom")
    return out


def custom_input(arguments: str) -> str:
    """A custom tool's input from the engine's arguments (`{"input": "..."}`); arguments
    of another shape are handed on as they are."""
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    text = parsed.get("input") if isinstance(parsed, dict) else None
    return text if isinstance(text, str) else arguments


def custom_arguments(text: object) -> str:
    """A custom tool call's input sent back in a request, as the engine's arguments."""
    return orjson.dumps({"input": text if isinstance(text, str) else ""}).decode()
