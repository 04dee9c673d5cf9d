"""The simulated engine's text: a fixed cycle of words, one word per token, and where a
`stop` string cuts it (as an engine stops: the text before the match, the match itself
never sent, `finish_reason` "stop" with the matched string as `stop_reason`). Pure.
"""

from __future__ import annotations

from typing import NamedTuple

import orjson

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "again", "and", "so")
WORD_JSON = tuple(orjson.dumps(w + " ") for w in WORDS)
CYCLE = "".join(w + " " for w in WORDS)
PREFIXES = tuple(CYCLE[: sum(len(w) + 1 for w in WORDS[:j])] for j in range(len(WORDS)))


def text(tokens: int) -> str:
    """The text of `tokens` words."""
    return CYCLE * (tokens // len(WORDS)) + PREFIXES[tokens % len(WORDS)]


class Stopped(NamedTuple):
    """An answer cut by a stop string: its pieces (one per token) and the string matched."""

    pieces: tuple[str, ...]
    matched: str


def cut(tokens: int, stops: tuple[str, ...]) -> Stopped | None:
    """Where the earliest of `stops` cuts the text of `tokens` words; None: it doesn't.
    At least one piece (maybe empty) stays: the token that matched was generated."""
    whole = text(tokens)
    found = [(at, stop) for stop in stops if (at := whole.find(stop)) >= 0]
    if not found:
        return None
    at, matched = min(found)
    pieces, start = [], 0
    for i in range(tokens):
        if start >= at:
            break
        word = WORDS[i % len(WORDS)] + " "
        pieces.append(whole[start:min(start + len(word), at)])
        start += len(word)
    return Stopped(tuple(pieces) or ("",), matched)
