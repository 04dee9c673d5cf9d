"""The body a backend is sent: the client's, with the backend's model name and the usage
asked for, the gateway's own options taken out, and (for a backend whose chat template
takes one system message only) the system messages folded into one, first.
"""

from __future__ import annotations

from typing import Any

import orjson

from router.common.parsed import ParsedRequest


def upstream_body(parsed: ParsedRequest, upstream_model: str,
                  fold_system: bool = False) -> bytes:
    """The body sent upstream: the client's, with `model` rewritten and usage asked for;
    `fold_system`: its system messages made one, first (for an engine whose chat template
    takes no other)."""
    body = dict(parsed.body)
    body["model"] = upstream_model
    if fold_system and isinstance(body.get("messages"), list):
        body["messages"] = folded(body["messages"])
    body.pop("slotgate", None)  # the gateway's own options never reach an engine
    if parsed.stream and not parsed.wants_usage:
        options = dict(body.get("stream_options") or {})
        options["include_usage"] = True
        body["stream_options"] = options
    return orjson.dumps(body)


def folded(messages: list[Any]) -> list[Any]:
    """`messages` with one system message, first: every system message's text joined in
    order (a blank line between); the rest in order. Unchanged when there is nothing to
    fold (no system message past the first place)."""
    late = [i for i, m in enumerate(messages)
            if i and isinstance(m, dict) and m.get("role") == "system"]
    if not late:
        return messages
    systems = [m for m in messages if isinstance(m, dict) and m.get("role") == "system"]
    texts = [_text_of(m.get("content")) for m in systems]
    rest = [m for m in messages if not (isinstance(m, dict) and m.get("role") == "system")]
    return [{"role": "system", "content": "\n\n".join(t for t in texts if t)}, *rest]


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: their text
        return "\n".join(part["text"] for part in content
                         if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""
