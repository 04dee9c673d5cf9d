"""The pairwise judge (#33): its fixed prompt, the parsing of its reply and the verdict of
both orders. Pure: no I/O, nothing logged (the texts are the users').

The judge sees the question and two answers, A and B, and replies "A", "B" or "TIE". Each
pair is judged twice, the small model's answer first as A, then as B, so that a judge that
prefers a position cancels out (`combine`). Any change to the prompt or the parsing is a
new JUDGE_VERSION: verdicts of different versions are not pooled.
"""

from __future__ import annotations

import enum
import re
from typing import Final

from classifier.features import cjk_share

JUDGE_VERSION: Final = "pairwise-1"
# Characters kept of the question and of each answer: 3 x 1,500 characters stay within
# a 4k-token context even in Chinese (about a token a character), with room for the
# prompt and the one-word reply.
TEXT_CHARS: Final = 1500
CUT_MARK: Final = " [...]"
CJK_LANGUAGE_SHARE: Final = 0.3  # above it a text counts as Chinese

SYSTEM_PROMPT: Final = (
    "You are a strict, impartial judge of answers given by AI assistants. You are shown a "
    "user's question and two answers, A and B. Decide which answer serves the user better: "
    "correct, helpful, complete for what was asked, and in the user's language. Length is "
    "not merit. The order of the answers says nothing. A text that ends with \"[...]\" was "
    "cut for length: do not count the cut against it. If both serve the user about equally "
    "well, or equally badly, the verdict is TIE. Reply with exactly one word: A, B or TIE."
)


class Verdict(enum.StrEnum):
    """The small model's answer against the primary's."""

    BETTER = "better"
    TIE = "tie"
    WORSE = "worse"


def judge_messages(question: str, first: str, second: str) -> list[dict[str, str]]:
    """The judge's chat messages: `first` is answer A, `second` answer B; each text cut to
    TEXT_CHARS characters."""
    user = (f"[Question]\n{_bounded(question)}\n\n"
            f"[Answer A]\n{_bounded(first)}\n\n"
            f"[Answer B]\n{_bounded(second)}\n\n"
            "Which answer serves the user better? Reply with exactly one of: A, B, TIE.")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def _bounded(text: str) -> str:
    text = text.strip()
    if len(text) <= TEXT_CHARS:
        return text
    return text[:TEXT_CHARS - len(CUT_MARK)].rstrip() + CUT_MARK


_DECORATION = re.compile(r"\*\*|__|`")  # markdown bold and code marks
_PICK = re.compile(
    r"""(?:(?:final\s+)?(?:answer|verdict|choice|winner)(?:\s*[:：=-]\s*|\s+))?  # "Answer: "
        ["'“”‘’«»(\[]*\s*
        (a|b|tie)
        \s*["'“”‘’«»)\]]*
        \s*[.!。]?""",
    re.IGNORECASE | re.VERBOSE)


def parse_pick(text: str) -> str | None:
    """"A", "B" or "TIE" from the judge's reply; None for anything else (both letters, an
    essay, nothing), which counts as no verdict."""
    found = _PICK.fullmatch(_DECORATION.sub("", text).strip())
    return None if found is None else found[1].upper()


_PICKS: Final = frozenset({"A", "B", "TIE"})


def combine(small_first: str | None, small_second: str | None) -> Verdict | None:
    """The verdict of both orders: `small_first` is the pick with the small model's answer
    as A, `small_second` with it as B. Preferred in both orders: BETTER; in neither: WORSE;
    a tie or a split: TIE; no pick in either order: None."""
    for pick in (small_first, small_second):
        if pick is not None and pick not in _PICKS:
            raise ValueError(f"a pick is 'A', 'B' or 'TIE', not {pick!r}")
    if small_first is None or small_second is None:
        return None
    if (small_first, small_second) == ("A", "B"):
        return Verdict.BETTER
    if (small_first, small_second) == ("B", "A"):
        return Verdict.WORSE
    return Verdict.TIE


def language(text: str) -> str:
    """"zh" when more than CJK_LANGUAGE_SHARE of the text is kana or CJK ideographs (as the
    classifier counts them), else "en": the classifier's corpus is English and Chinese."""
    return "zh" if cjk_share(text) > CJK_LANGUAGE_SHARE else "en"
