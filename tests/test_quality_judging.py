"""The pairwise judge's pure parts (policies/quality/judging.py): its messages and their
bounds, the parsing of its reply, the verdict of both orders and the language of a text."""

from __future__ import annotations

import numpy as np
import pytest

from classifier.features import SHAPE_NAMES, FeatureSettings, cjk_share, featurize
from policies.quality.judging import (
    CUT_MARK,
    JUDGE_VERSION,
    SYSTEM_PROMPT,
    TEXT_CHARS,
    Verdict,
    combine,
    judge_messages,
    language,
    parse_pick,
)


@pytest.mark.parametrize(("reply", "pick"), [
    ("A", "A"), ("B", "B"), ("TIE", "TIE"),
    ("a", "A"), ("b", "B"), ("tie", "TIE"), ("Tie", "TIE"),
    ("  A\n", "A"), ("\tB ", "B"),
    ('"A"', "A"), ("'B'", "B"), ("“TIE”", "TIE"), ("(A)", "A"), ("[B]", "B"),
    ("A.", "A"), ("TIE.", "TIE"), ("B!", "B"), ("A。", "A"),
    ("Answer: A", "A"), ("answer: b", "B"), ("Answer:A", "A"), ("answer B", "B"),
    ("Final answer: TIE", "TIE"), ("Verdict - B", "B"), ("Winner: A.", "A"),
    ("**A**", "A"), ("**Answer: B**", "B"), ("Answer: **TIE**", "TIE"), ("`A`", "A"),
    ("__B__", "B"),
    # no verdict
    ("", None), ("   ", None), ("A and B", None), ("AB", None), ("A B", None),
    ("A\nB", None), ("C", None), ("answer", None), ("answera", None), ("tied", None),
    ("Both are fine", None), ("The answer is A because it is correct.", None),
    ("Answer A is better than answer B", None), ("A, because", None), ("none", None),
])
def test_the_judges_reply_is_read_or_is_no_verdict(reply: str, pick: str | None) -> None:
    assert parse_pick(reply) == pick


@pytest.mark.parametrize(("small_first", "small_second", "verdict"), [
    ("A", "B", Verdict.BETTER),  # the small model's answer preferred in both orders
    ("B", "A", Verdict.WORSE),  # the primary's preferred in both
    ("TIE", "TIE", Verdict.TIE),
    ("A", "A", Verdict.TIE),  # the judge prefers the first position: a split
    ("B", "B", Verdict.TIE),  # ... or the second
    ("A", "TIE", Verdict.TIE), ("TIE", "B", Verdict.TIE),
    ("B", "TIE", Verdict.TIE), ("TIE", "A", Verdict.TIE),
    (None, "B", None), ("A", None, None), (None, None, None),
])
def test_both_orders_make_one_verdict(small_first: str | None, small_second: str | None,
                                      verdict: Verdict | None) -> None:
    assert combine(small_first, small_second) is verdict


@pytest.mark.parametrize("pick", ["a", "C", "", "better"])
def test_a_pick_parse_pick_cannot_make_is_refused(pick: str) -> None:
    with pytest.raises(ValueError, match="a pick is"):
        combine(pick, "A")


def test_verdicts_are_stored_by_their_values() -> None:
    assert [v.value for v in Verdict] == ["better", "tie", "worse"]
    assert JUDGE_VERSION == "pairwise-1"


def test_the_judge_sees_the_question_and_both_answers_labelled() -> None:
    system, user = judge_messages("What is 2+2?", "It is 4.", "Four.")
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert user["role"] == "user"
    text = user["content"]
    assert text.index("What is 2+2?") < text.index("[Answer A]\nIt is 4.") \
        < text.index("[Answer B]\nFour.")
    assert "exactly one of: A, B, TIE" in text
    assert "A, B or TIE" in SYSTEM_PROMPT


def test_each_text_is_cut_to_its_bound_and_says_so() -> None:
    long, short = "x" * (3 * TEXT_CHARS), "y" * TEXT_CHARS
    _, user = judge_messages(long, short, "第" * (2 * TEXT_CHARS))
    parts = user["content"].split("\n\n")
    question, first, second = (p.split("\n", 1)[1] for p in parts[:3])
    assert len(question) == TEXT_CHARS and question.endswith(CUT_MARK)
    assert first == short  # at the bound: kept whole
    assert len(second) == TEXT_CHARS and second.endswith(CUT_MARK)
    assert len(user["content"]) < 3 * TEXT_CHARS + 200  # the judge's request stays small


@pytest.mark.parametrize(("text", "lang"), [
    ("How do I reverse a list in Python?", "en"),
    ("把这句话翻译成英文", "zh"),
    ("你好，世界！", "zh"),
    ("こんにちは、元気ですか", "zh"),  # kana count as the classifier counts them
    ("用 Python 写一个 function that sorts a list", "en"),  # a few ideographs: 10%
    ("请用 Python 写一个排序函数", "zh"),
    ("", "en"), ("12345", "en"), ("안녕하세요", "en"),  # Hangul is a spaced script
])
def test_the_language_of_a_text(text: str, lang: str) -> None:
    assert language(text) == lang


@pytest.mark.parametrize("text", ["hello world", "你好，世界", "混合 text 文本", "", "  x  "])
def test_the_cjk_share_is_the_classifiers_signal(text: str) -> None:
    settings = FeatureSettings()
    columns, values = featurize(text, settings)
    at = settings.n_hashed + SHAPE_NAMES.index("cjk_ratio")
    signal = float(values[columns == at].sum()) if np.any(columns == at) else 0.0
    assert cjk_share(text) == pytest.approx(signal, abs=1e-6)
