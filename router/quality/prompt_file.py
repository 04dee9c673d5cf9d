"""The prompt file of `slotgate evaluate` (#33): JSON Lines, one request a line, read within
bounds, every bad line refused with its number. Never logs a prompt.

A line is either a chat request body, `{"messages": [...]}` (with `max_tokens` or any other
field a chat request may carry), or `{"prompt": "text"}`, one user message; either may have
an `"intent"` label, kept beside the classifier's. `model` and `stream` are left out: the
evaluation names the backend and reads whole answers. Blank lines are skipped.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

MAX_BYTES: Final = 64 * 1024 * 1024  # of the whole file
MAX_LINE_BYTES: Final = 1024 * 1024  # of one line (the gateway's default body cap)
MAX_PROMPTS: Final = 10_000
MAX_LABEL: Final = 64  # characters of an intent label
_LEFT_OUT: Final = ("model", "stream", "stream_options")


@dataclass(frozen=True, slots=True)
class EvalPrompt:
    line: int  # its line in the file, from 1
    body: dict[str, Any]  # a chat request's body, without model and stream
    label: str | None  # the file's intent label


class PromptFileError(ValueError):
    """The prompt file cannot be read, or one of its lines is not a prompt."""

    def __init__(self, path: Path, message: str, line: int | None = None) -> None:
        where = f"{path}" if line is None else f"{path}, line {line}"
        super().__init__(f"{where}: {message}")
        self.line = line


def read_prompts(path: Path, limit: int | None = None) -> list[EvalPrompt]:
    """The file's prompts (its first `limit` with a limit), in order. Raises
    PromptFileError for an unreadable or oversized file, or the first bad line."""
    prompts: list[EvalPrompt] = []
    size = 0
    try:
        with path.open("rb") as file:
            for number in itertools.count(1):
                if limit is not None and len(prompts) >= limit:
                    break
                raw = file.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    break
                size += len(raw)
                if len(raw) > MAX_LINE_BYTES:
                    raise PromptFileError(path, f"longer than {MAX_LINE_BYTES:,} bytes", number)
                if size > MAX_BYTES:
                    raise PromptFileError(path, f"the file is larger than {MAX_BYTES:,} bytes")
                if not raw.strip():
                    continue
                if len(prompts) >= MAX_PROMPTS:
                    raise PromptFileError(path, f"more than {MAX_PROMPTS:,} prompts: split the "
                                          "file or give --limit")
                try:
                    prompts.append(parse_line(raw, number))
                except ValueError as exc:
                    raise PromptFileError(path, str(exc), number) from None
    except OSError as exc:
        raise PromptFileError(path, exc.strerror or type(exc).__name__) from None
    if not prompts:
        raise PromptFileError(path, "no prompt in the file")
    return prompts


def parse_line(raw: bytes, number: int) -> EvalPrompt:
    """One non-blank line; raises ValueError saying what is wrong with it."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"a line is a JSON object, not {type(data).__name__}")
    label = data.pop("intent", None)
    if label is not None and not (isinstance(label, str) and 0 < len(label) <= MAX_LABEL):
        raise ValueError(f"'intent' is a label of 1 to {MAX_LABEL} characters")
    if ("messages" in data) == ("prompt" in data):
        raise ValueError("a line has either 'messages' (a chat request) or 'prompt' (a text)")
    if "prompt" in data:
        prompt = data.pop("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("'prompt' is a non-empty string")
        data["messages"] = [{"role": "user", "content": prompt}]
    messages = data["messages"]
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise ValueError("'messages' is a non-empty list of objects, each with a 'role'")
    tokens = data.get("max_tokens")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                               or tokens < 1):
        raise ValueError("'max_tokens' is a whole number of at least 1")
    for key in _LEFT_OUT:
        data.pop(key, None)
    return EvalPrompt(number, data, label)
