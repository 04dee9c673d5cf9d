"""What an engine's 200 must hold, checked on the way through: a non-streaming answer is
a JSON object with the list its API promises, a stream has at least one event whose data
is a JSON object. Anything else is the engine's fault (`bad_answer`), like a dropped
connection. The answer is parsed once here; its usage and translation read that parse.
"""

from __future__ import annotations

from typing import Any

import orjson

from policies.health.failures import FailureKind
from policies.scheduler.capabilities import estimate_tokens
from router.apis.dialect import Relay
from router.common.parsed import Endpoint
from router.common.usage import Usage
from router.upstream.failures import UpstreamFailure
from router.upstream.response import Response

# A stream's bytes held back until its first valid event (comments, a split first event).
MAX_OPENING_BYTES = 64 * 1024
# The list each API's answer holds (an answer without it is no answer).
_PROMISED = {Endpoint.CHAT: "choices", Endpoint.COMPLETIONS: "choices",
             Endpoint.EMBEDDINGS: "data", Endpoint.RESPONSES: "output",
             Endpoint.MESSAGES: "content"}


def bad_answer(name: str, what: str) -> UpstreamFailure:
    """An engine's 200 that is not what its API promises: its fault, like a dropped
    connection (counted against it, retried on a sibling while nothing was sent)."""
    return UpstreamFailure(FailureKind.BAD_ANSWER, name,
                           f"Backend '{name}' sent an invalid answer: {what}.")


async def opening_of(events: Relay, chunk: bytes, up: Response, name: str
                   ) -> tuple[bytes, bool]:
    """Feed the stream until its first valid event: (what to send first, has it ended).
    An engine that ends, or says MAX_OPENING_BYTES, without one valid event is at fault."""
    held: list[bytes] = []
    size = 0
    while chunk:
        out = events.feed(chunk)
        if events.valid:
            return (b"".join(held) + out if held else out), False
        held.append(out)
        size += len(out)
        if size > MAX_OPENING_BYTES:
            raise bad_answer(name, f"no valid event in its first {MAX_OPENING_BYTES} bytes")
        chunk = await up.readany()
    held.append(events.flush())
    if not events.valid:
        raise bad_answer(name, "a stream without one valid event")
    return b"".join(held), True


def answer_object(raw: bytes, endpoint: Endpoint, name: str) -> dict[str, Any]:
    """The engine's whole answer, parsed once: a JSON object holding the list its API
    promises (`choices`, `data`, `output`, `content`), else the engine is at fault."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise bad_answer(name, "not JSON") from None
    key = _PROMISED[endpoint]
    if not isinstance(obj, dict) or not isinstance(obj.get(key), list):
        raise bad_answer(name, f"no '{key}' list")
    return obj


def usage_from_answer(obj: dict[str, Any], usage: Usage) -> None:
    """The backend's usage; failing that, an estimate from the answer's text (not `known`)."""
    usage.update(obj.get("usage"))
    if usage.rejected:  # a translated answer shows the gateway's estimate, not these
        obj.pop("usage", None)
    if usage.known:
        return
    if not isinstance(obj.get("choices"), list) and not isinstance(obj.get("output"), list):
        return
    text = answer_text(obj)
    usage.completion_tokens = estimate_tokens(len(text), len(text.encode(errors="replace")))


def answer_text(obj: dict[str, Any]) -> str:
    """A whole answer's text: its choices' (chat, completions) or its output's (a
    Responses answer passed through)."""
    if isinstance(obj.get("choices"), list):
        return "".join(_answer_text(choice) for choice in obj["choices"])
    if isinstance(obj.get("output"), list):
        return "".join(_output_text(item) for item in obj["output"])
    return ""


def _output_text(item: object) -> str:
    content = item.get("content") if isinstance(item, dict) else None
    if not isinstance(content, list):
        return ""
    return "".join(part["text"] for part in content
                   if isinstance(part, dict) and isinstance(part.get("text"), str))


def _answer_text(choice: object) -> str:
    if not isinstance(choice, dict):
        return ""
    message = choice.get("message")
    content = message.get("content") if isinstance(message, dict) else choice.get("text")
    return content if isinstance(content, str) else ""
