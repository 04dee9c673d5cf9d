"""The text the classifier looks at, taken from an OpenAI request body.

Last user turn plus the head of the system prompt, cut to a fixed budget. Never raises:
any odd shape yields less text (possibly "").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

SYSTEM_HEAD: Final = 200  # characters of the system prompt kept
HEAD: Final = 1500  # long texts keep their first HEAD characters ...
TAIL: Final = 500  # ... and their last TAIL (a newline in between counts towards TAIL)
BUDGET: Final = HEAD + TAIL

_SYSTEM_ROLES: Final = frozenset({"system", "developer"})


def request_text(body: Mapping[str, Any]) -> str:
    """The classifier's input for a chat, completions or Responses request body."""
    if not isinstance(body, dict):  # (parsed JSON: a dict; an ABC check costs 10x more)
        return ""
    messages = body.get("messages")
    if isinstance(messages, list):
        return clip(_chat_text(messages))
    if "input" in body and "prompt" not in body:  # a Responses request (passed through)
        return clip(_chat_text(_responses_turns(body)))
    return clip(_prompt_text(body.get("prompt")))


def _responses_turns(body: Mapping[str, Any]) -> list[Any]:
    """A Responses request's instructions and input as chat-like turns."""
    turns: list[Any] = [{"role": "system", "content": body.get("instructions")}]
    source = body.get("input")
    if isinstance(source, str):
        turns.append({"role": "user", "content": source})
    elif isinstance(source, list):
        turns.extend(source)  # message items carry a role and content; others are skipped
    return turns


def clip(text: str) -> str:
    """At most BUDGET characters: the head and the tail of a long text."""
    if len(text) <= BUDGET:
        return text
    return text[:HEAD] + "\n" + text[len(text) - TAIL + 1 :]


def _chat_text(messages: list[Any]) -> str:
    """The last user turn (else the last turn) and the head of the first system prompt.
    Only the turns that can be those are read: a long conversation costs its last turns
    and its first system ones, not all of them."""
    user = last_any = ""
    for message in reversed(messages):  # from the end, to the last user turn with text
        if not isinstance(message, dict):
            continue
        content = _content_text(message.get("content"))
        if content:
            last_any = last_any or content
            if message.get("role") == "user":
                user = content
                break
    system = ""
    for message in messages:  # the first system prompt with text sets the scene
        if isinstance(message, dict) and _is_system(message.get("role")):
            system = _content_text(message.get("content"))
            if system:
                break
    # A conversation without a user turn (odd, but legal) is judged by its last message.
    text = user or (last_any if last_any != system else "")
    head = system[:SYSTEM_HEAD].strip()
    if head and text:
        return head + "\n" + text
    return head or text


def _is_system(role: object) -> bool:
    return isinstance(role, str) and role in _SYSTEM_ROLES  # (a role may be any JSON)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content.strip()
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict) and part.get("type") in ("text", "input_text"):
            text = part.get("text")
            if isinstance(text, str):
                parts.append(text)
    return "\n".join(p.strip() for p in parts if p.strip())


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt.strip()
    if isinstance(prompt, list):  # a batch of prompts; token-id lists carry no text
        return "\n".join(p.strip() for p in prompt if isinstance(p, str) and p.strip())
    return ""
