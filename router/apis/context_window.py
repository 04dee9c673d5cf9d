"""An engine's refusal of a request beyond its context window, read from the words each
engine uses, and said again in the words each API's clients act on.

Engines refuse such a request with a 400 whose only structure is its message; clients
recognise the case by their own API's wording: OpenAI's code `context_length_exceeded`
(Codex starts a new context window on it), and Anthropic's two messages, which Claude Code
parses for their numbers ("prompt is too long: N tokens > M maximum" makes it compact
the conversation; "input length and `max_tokens` exceed context limit: P + C > M" makes it
ask again with a smaller `max_tokens`). Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CODE = "context_length_exceeded"  # OpenAI's code for it, relayed when the engine gave none


@dataclass(frozen=True, slots=True)
class Overflow:
    """The request's prompt tokens, its output cap (None: the prompt alone is too long)
    and the window, as the engine counted them."""

    prompt: int
    limit: int
    completion: int | None = None


_P, _L, _C = "prompt", "limit", "completion"
# Each engine's wording, with its numbers named (vLLM old and new, SGLang, TGI).
_WORDINGS = tuple(re.compile(pattern) for pattern in (
    # vLLM >= 0.8: max_tokens too large for what the prompt leaves
    rf"is too large: (?P<{_C}>\d+)\. This model's maximum context length is (?P<{_L}>\d+) "
    rf"tokens and your request has (?P<{_P}>\d+) input tokens",
    # vLLM (and OpenAI) before: the total
    rf"maximum context length is (?P<{_L}>\d+) tokens\. However, you requested \d+ tokens "
    rf"\((?P<{_P}>\d+) in the messages, (?P<{_C}>\d+) in the completion\)",
    # vLLM >= 0.8: the prompt alone
    rf"maximum context length is (?P<{_L}>\d+) tokens\. However, your request has "
    rf"(?P<{_P}>\d+) input tokens",
    rf"prompt \(length (?P<{_P}>\d+)\) is longer than the maximum model length of "
    rf"(?P<{_L}>\d+)",
    # SGLang
    rf"input \((?P<{_P}>\d+) tokens\) is longer than the model's context length "
    rf"\((?P<{_L}>\d+) tokens\)",
    rf"maximum context length of (?P<{_L}>\d+) tokens\. You requested a total of \d+ "
    rf"tokens: (?P<{_P}>\d+) tokens from the input messages and (?P<{_C}>\d+) tokens for "
    rf"the completion",
    # llama.cpp (its numbers are fields of its error, which the relay adds to the message)
    rf"exceeds the available context size.*\(n_prompt_tokens: (?P<{_P}>\d+), n_ctx: "
    rf"(?P<{_L}>\d+)\)",
    # TGI
    rf"`inputs` tokens \+ `max_new_tokens` must be <= (?P<{_L}>\d+)\. Given: (?P<{_P}>\d+) "
    rf"`inputs` tokens and (?P<{_C}>\d+) `max_new_tokens`",
))
_MAX_MESSAGE = 2048  # longer messages are no engine's wording of this case


def overflow(message: str) -> Overflow | None:
    """The overflow an engine's 400 message describes, or None."""
    if len(message) > _MAX_MESSAGE or ("context" not in message and "max" not in message):
        return None
    for wording in _WORDINGS:
        found = wording.search(message)
        if found is not None:
            numbers = found.groupdict()
            completion = numbers.get(_C)
            return Overflow(int(numbers[_P]), int(numbers[_L]),
                            None if completion is None else int(completion))
    return None


def anthropic_message(found: Overflow) -> str:
    """Anthropic's wording of the overflow: the prompt alone, or the prompt with
    `max_tokens`."""
    if found.completion is None or found.prompt >= found.limit:
        return f"prompt is too long: {found.prompt} tokens > {found.limit} maximum"
    return (f"input length and `max_tokens` exceed context limit: {found.prompt} + "
            f"{found.completion} > {found.limit}, decrease input length or `max_tokens` "
            f"and try again")
