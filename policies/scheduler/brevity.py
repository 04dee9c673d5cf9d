"""Brevity as evidence that a request is simple.  Pure: no I/O, no clock.

A request's own size counts: a small `max_tokens`, or an explicit cue that it wants a short
answer ("in one line", "briefly", "一句话", "简短", ...), makes it likelier to be simple. Each
piece of evidence multiplies the odds that the request is simple by a fixed likelihood
ratio (Bayes' rule on odds): p' = p L / (p L + 1 - p), at most `P_MAX`. It only raises, and
only for a request the intent classifier already put in one of the route's `intents` that is
also a simple intent (`SIMPLE_INTENTS`): brevity alone never moves a code, math or
reasoning request (the classifier stays the quality gate), nor one of an intent the route
keeps on its primary.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import TYPE_CHECKING, Final

from policies.config import SIMPLE_INTENTS

if TYPE_CHECKING:
    from classifier.model import Prediction

TINY_MAX_TOKENS: Final = 64  # max_tokens at most this: a one-line answer at most
SHORT_MAX_TOKENS: Final = 256  # ... at most this: a short answer
TINY_RATIO: Final = 2.0  # likelihood ratios of each piece of evidence
SHORT_RATIO: Final = 1.5
CUE_RATIO: Final = 2.5
P_MAX: Final = 0.99  # brevity never makes a request certain

# Phrases asking for a short answer (English on word boundaries; CJK as written).
_CUES: Final = re.compile(
    r"\b(?:in (?:one|1|a single|a) (?:line|sentence|word|phrase)"
    r"|one[- ]liners?|one[- ]word answer|in (?:a )?(?:few|two|2|three|3|five|5) words"
    r"|briefly|brief (?:answer|reply|summary)|in brief|in short|short answer"
    r"|keep it (?:short|brief)|concisely|be concise|tl;?dr|yes or no)\b"
    r"|一句话|一句話|用一句|简短|簡短|简要|簡要|简洁|簡潔|一行|一个词|一個詞|一言で|簡潔に",
    re.IGNORECASE,
)
_SIMPLE: Final = frozenset(SIMPLE_INTENTS)


def has_brevity_cue(text: str) -> bool:
    """Does `text` (the classifier's text of the request) ask for a short answer?"""
    return _CUES.search(text) is not None


def brevity_ratio(max_tokens: int | None, text: str) -> float:
    """How much likelier a request of this size and wording is to be simple: the product of
    the likelihood ratios of its evidence (1.0: none)."""
    ratio = 1.0
    if max_tokens is not None and max_tokens <= TINY_MAX_TOKENS:
        ratio *= TINY_RATIO
    elif max_tokens is not None and max_tokens <= SHORT_MAX_TOKENS:
        ratio *= SHORT_RATIO
    if has_brevity_cue(text):
        ratio *= CUE_RATIO
    return ratio


def lean_simple(p_simple: float, intent: str, route_intents: Collection[str],
                max_tokens: int | None, text: str) -> float:
    """`p_simple` raised by the request's brevity, for an `intent` both simple and one of
    `route_intents`; unchanged otherwise (and never lowered)."""
    if intent not in route_intents or intent not in _SIMPLE or p_simple >= P_MAX:
        return p_simple
    ratio = brevity_ratio(max_tokens, text)
    if ratio == 1.0 or p_simple <= 0.0:
        return p_simple
    leaned = p_simple * ratio / (p_simple * ratio + 1.0 - p_simple)
    return max(p_simple, min(P_MAX, leaned))


def steering_odds(prediction: Prediction, route_intents: Collection[str],
                  max_tokens: int | None, text: str) -> float:
    """How likely a request is simple, as steering reads it (and `slotgate evaluate`): the
    classifier's probability of the route's `intents`, leaned by the request's brevity."""
    return lean_simple(prediction.p_simple(route_intents), prediction.intent, route_intents,
                       max_tokens, text)
