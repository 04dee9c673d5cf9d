"""policies.scheduler.brevity: a small max_tokens or a cue asking for a short answer leans a request
simple, only ever upwards and only for a simple intent the route lists."""

from __future__ import annotations

import pytest

from classifier.model import Prediction
from policies.config import COMPLEX_INTENTS, SIMPLE_INTENTS
from policies.scheduler.brevity import (
    CUE_RATIO,
    P_MAX,
    SHORT_RATIO,
    TINY_RATIO,
    brevity_ratio,
    has_brevity_cue,
    lean_simple,
    steering_odds,
)

ROUTE = frozenset(SIMPLE_INTENTS)


@pytest.mark.parametrize(
    ("text", "cue"),
    [
        ("What is the capital of France? Answer in one line.", True),
        ("Summarize this in one sentence: the meeting moved to Thursday.", True),
        ("Briefly, what does HTTP 418 mean?", True),
        ("Give me a one-liner about cats", True),
        ("Describe Paris in three words", True),
        ("Keep it short: is water wet?", True),
        ("tl;dr of the article below", True),
        ("Is the sky blue? yes or no", True),
        ("用一句话总结这篇文章", True),
        ("请简短回答：今天星期几？", True),
        ("简要说明一下会议内容", True),
        ("What is the capital of France?", False),
        ("Write a detailed report on the French revolution.", False),
        ("The briefcase is on the table; where is it?", False),  # a word, not a cue
        ("online shortcuts", False),
        ("总结这篇文章", False),
        ("", False),
    ],
)
def test_brevity_cues(text: str, cue: bool) -> None:
    assert has_brevity_cue(text) is cue


@pytest.mark.parametrize(
    ("max_tokens", "text", "ratio"),
    [
        (None, "hello", 1.0),
        (1000, "hello", 1.0),
        (257, "hello", 1.0),
        (256, "hello", SHORT_RATIO),
        (65, "hello", SHORT_RATIO),
        (64, "hello", TINY_RATIO),
        (1, "hello", TINY_RATIO),
        (None, "in one line please", CUE_RATIO),
        (20, "in one line please", TINY_RATIO * CUE_RATIO),
        (200, "一句话", SHORT_RATIO * CUE_RATIO),
    ],
)
def test_brevity_ratio(max_tokens: int | None, text: str, ratio: float) -> None:
    assert brevity_ratio(max_tokens, text) == pytest.approx(ratio)


@pytest.mark.parametrize(
    ("p", "intent", "max_tokens", "text", "expected"),
    [
        # No evidence: unchanged.
        (0.7, "simple_qa", None, "What is the capital of France?", 0.7),
        # A cue: odds x2.5 (0.7 -> 0.854), enough to pass the default 0.8 threshold.
        (0.7, "simple_qa", None, "Capital of France, in one word?", 0.7 * 2.5 / (0.7 * 2.5 + 0.3)),
        # A tiny max_tokens and a cue: odds x5 (0.5 -> 0.833).
        (0.5, "translate", 30, "简短翻译：good morning", 5 / 6),
        (0.5, "summarize", 200, "hello", 0.6),  # x1.5
        # Capped below certainty, and never lowered.
        (0.98, "greeting", 10, "briefly", P_MAX),
        (0.995, "greeting", 10, "briefly", 0.995),
        (0.0, "greeting", 10, "briefly", 0.0),
    ],
)
def test_lean_simple(p: float, intent: str, max_tokens: int | None, text: str,
                     expected: float) -> None:
    assert lean_simple(p, intent, ROUTE, max_tokens, text) == pytest.approx(expected)


@pytest.mark.parametrize("intent", COMPLEX_INTENTS)
def test_brevity_never_leans_a_complex_intent(intent: str) -> None:
    """Even when the route lists it: the classifier stays the quality gate."""
    everything = frozenset({*SIMPLE_INTENTS, *COMPLEX_INTENTS})
    assert lean_simple(0.5, intent, everything, 10, "in one line, briefly") == 0.5


def test_brevity_never_leans_an_intent_the_route_keeps_on_its_primary() -> None:
    assert lean_simple(0.5, "translate", frozenset({"greeting"}), 10, "briefly") == 0.5
    assert lean_simple(0.5, "greeting", frozenset({"greeting"}), 10, "briefly") > 0.8


def test_steering_odds_are_the_route_intents_share_leaned_by_brevity() -> None:
    """What steering and `slotgate evaluate` read: the probability of the route's intents."""
    said = Prediction("greeting", 0.4, {"greeting": 0.4, "translate": 0.2, "code": 0.4})
    assert steering_odds(said, frozenset({"greeting"}), None, "hello") == pytest.approx(0.4)
    assert steering_odds(said, ROUTE, None, "hello") == pytest.approx(0.6)
    assert steering_odds(said, ROUTE, 10, "hello") == pytest.approx(
        lean_simple(0.6, "greeting", ROUTE, 10, "hello"))
    assert steering_odds(said, ROUTE, 10, "hello") > 0.6
