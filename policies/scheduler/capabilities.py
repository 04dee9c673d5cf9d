"""What a request needs from a backend, and whether a backend serves it.  Pure: a parsed
body in, plain values out; no I/O, no clock.

A request needs `tools` when it offers tools or functions (or carries a tool exchange in
its messages), `vision` when a message holds an image part, `json_schema` when its
`response_format` asks for a JSON schema; and room for its size (a generous prompt
estimate plus its output budget) in the backend's context window. A move to another
backend (steering, overflow, failover) takes only a backend that serves all of it; the
route's primary is never second-guessed.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from policies.apis import Api
from policies.clock.lengths import OUTPUT_PRIOR


class Capability(enum.StrEnum):
    """A feature of the OpenAI API that not every engine or model serves."""

    TOOLS = "tools"  # `tools` / `functions`, tool calls and tool results in messages
    VISION = "vision"  # image parts in message content
    JSON_SCHEMA = "json_schema"  # response_format {"type": "json_schema"}


ALL_CAPABILITIES: frozenset[Capability] = frozenset(Capability)


class Lack(enum.StrEnum):
    """Why a backend cannot serve a request: the request's API, a capability it has not, or
    too small a window. Its value ends the route reason of a request a lack kept in place
    (`primary:needs:...`)."""

    API = "api"
    TOOLS = "tools"
    VISION = "vision"
    JSON_SCHEMA = "json_schema"
    CONTEXT = "context"


# Not frozen, though never changed once made: one is made for every request, and a frozen
# dataclass sets each field through object.__setattr__ (a Run: 0.92 -> 0.24 us to make).
@dataclass(slots=True)
class Needs:
    """What a request asks of whichever backend serves it."""

    capabilities: frozenset[Capability] = frozenset()
    tokens: int = 0  # prompt estimate + output budget (max_tokens, else the default)
    api: Api | None = None  # the client API it came on (None: any backend's will do)


@dataclass(frozen=True, slots=True)
class Ability:
    """What a backend offers: its capabilities, its context window (None: unknown,
    taken as large enough) and the client APIs it serves."""

    capabilities: frozenset[Capability] = ALL_CAPABILITIES
    context_window: int | None = None
    apis: frozenset[Api] = frozenset(Api)


_IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})
_TOOL_ROLES = frozenset({"tool", "function"})


def needs_of(body: Mapping[str, Any], prompt_tokens: int, max_tokens: int | None,
             api: Api | None = None) -> Needs:
    """What the request in `body` needs; `prompt_tokens` is its prompt's estimate
    (`estimate_tokens`), `max_tokens` its output cap (None: the default budget), `api` the
    client API it came on."""
    wanted: set[Capability] = set()
    if _nonempty(body.get("tools")) or _nonempty(body.get("functions")):
        wanted.add(Capability.TOOLS)
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":  # (parsed JSON: an
        # isinstance of dict, not of the Mapping ABC, whose check costs ten times more)
        wanted.add(Capability.JSON_SCHEMA)
    messages = body.get("messages")
    if isinstance(messages, list):
        wanted |= _message_needs(messages)
    return Needs(frozenset(wanted), size(prompt_tokens, max_tokens), api)


def size(prompt_tokens: int, max_tokens: int | None) -> int:
    """The tokens a request may take in a context window: its prompt and its output cap."""
    return prompt_tokens + (max_tokens if max_tokens is not None else OUTPUT_PRIOR)


def _nonempty(value: object) -> bool:
    return isinstance(value, list) and len(value) > 0


def _message_needs(messages: Iterable[object]) -> set[Capability]:
    found: set[Capability] = set()
    for message in messages:  # (plain loops: a conversation may hold hundreds of turns)
        if not isinstance(message, dict):
            continue
        if (message.get("role") in _TOOL_ROLES or message.get("tool_calls")
                or message.get("function_call")):
            found.add(Capability.TOOLS)  # a tool exchange only a tool-calling model reads
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and part.get("type") in _IMAGE_PARTS:
                    found.add(Capability.VISION)
                    break
    return found


def lack(needs: Needs, ability: Ability) -> Lack | None:
    """The first thing (in `Lack` order) the backend lacks to serve the request; None when
    it serves it."""
    if needs.api is not None and needs.api not in ability.apis:
        return Lack.API
    for capability in Capability:  # tools, vision, json_schema: a fixed, documented order
        if capability in needs.capabilities and capability not in ability.capabilities:
            return Lack(capability.value)
    window = ability.context_window
    if window is not None and needs.tokens > window:
        return Lack.CONTEXT
    return None


def serves(needs: Needs, ability: Ability) -> bool:
    return lack(needs, ability) is None


def first_lack(needs: Needs, abilities: Collection[Ability]) -> Lack | None:
    """Why none of `abilities` serves the request: the first one's lack (None when one of
    them serves it, or there is none)."""
    lacks = [lack(needs, ability) for ability in abilities]
    if not lacks or None in lacks:
        return None
    return lacks[0]


def body_tokens(raw: bytes) -> int:
    """`estimate_tokens` of a request body as sent: its characters counted without
    decoding it when it is ASCII (JSON escapes most text, base64 images are ASCII: a scan
    of 7 MiB takes a fraction of a millisecond, its decoding several)."""
    chars = len(raw) if raw.isascii() else len(raw.decode(errors="replace"))
    return estimate_tokens(chars, len(raw))


def estimate_tokens(text_chars: int, text_bytes: int) -> int:
    """A cheap, generous token estimate from a text's UTF-8 size.

    About four ASCII characters make a token; a CJK character (three UTF-8 bytes) is
    about one. Overestimating only keeps a request on the primary.
    """
    multibyte = text_bytes - text_chars  # two extra bytes per CJK character
    return max(1, text_chars // 4 + multibyte // 2)
