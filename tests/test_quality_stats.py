"""The quality figures (policies/quality/stats.py): Wilson intervals against known values,
non-loss rates per route, intent and language, and the table "if min_confidence were X"."""

from __future__ import annotations

import math

import pytest

from policies.quality.judging import Verdict
from policies.quality.stats import Group, Threshold, VerdictRow, by_group, thresholds, wilson

B, T, W = Verdict.BETTER, Verdict.TIE, Verdict.WORSE


@pytest.mark.parametrize(("successes", "n", "z", "low", "high"), [
    # statsmodels' proportion_confint(5, 10, method="wilson"); the others are the roots
    # of the score equation (p - x/n)² = z² p (1 - p) / n, solved apart
    (5, 10, 1.96, 0.236589594, 0.763410406),
    (0, 10, 1.96, 0.0, 1.96**2 / (10 + 1.96**2)),  # 0 of n: the upper end is z²/(n+z²)
    (10, 10, 1.96, 10 / (10 + 1.96**2), 1.0),
    (1, 1, 1.96, 1 / (1 + 1.96**2), 1.0),
    (81, 263, 1.96, 0.255287613, 0.366210684),
    (90, 100, 1.96, 0.825632696, 0.944771458),
    (90, 100, 2.576, 0.796240779, 0.953976484),  # 99 %
    (0, 0, 1.96, 0.0, 1.0),  # nothing known
])
def test_wilson_interval(successes: int, n: int, z: float, low: float, high: float) -> None:
    assert list(wilson(successes, n, z)) == pytest.approx([low, high], abs=1e-8)


@pytest.mark.parametrize(("successes", "n"), [(-1, 3), (4, 3), (0, -1)])
def test_wilson_refuses_impossible_counts(successes: int, n: int) -> None:
    with pytest.raises(ValueError, match=r"within 0\.\.n"):
        wilson(successes, n)


def vr(verdict: Verdict | None, *, route: str = "chat", intent: str | None = "greeting",
       lang: str = "en", p: float | None = 0.9, saved: float = 1.0) -> VerdictRow:
    return VerdictRow(ts=0.0, route=route, intent=intent, language=lang, p_simple=p,
                      prompt_tokens=10, verdict=verdict, saved=saved)


def test_non_loss_per_route_intent_and_language() -> None:
    rows = [vr(B), vr(T), vr(W), vr(None), vr(T),  # greeting en: 3 of 4, one without
            vr(W, lang="zh", saved=2.0), vr(B, lang="zh", saved=0.5),
            vr(T, intent="translate"),
            vr(None, intent=None),  # the judge never answered: no verdict, no rate
            vr(B, route="alpha", intent="summarize")]
    got = by_group(rows)
    assert [(g.route, g.intent, g.language) for g in got] == [
        ("alpha", "summarize", "en"),  # by route, then most verdicts first
        ("chat", "greeting", "en"), ("chat", "greeting", "zh"), ("chat", "translate", "en"),
        ("chat", None, "en"),
    ]
    greeting = got[1]
    assert greeting == Group("chat", "greeting", "en", 4, 1, 0.75, *wilson(3, 4), 5.0)
    assert got[2] == Group("chat", "greeting", "zh", 2, 0, 0.5, *wilson(1, 2), 2.5)
    none = got[4]
    assert (none.verdicts, none.no_verdict, none.low, none.high) == (0, 1, 0.0, 1.0)
    assert math.isnan(none.non_loss)


def test_groups_of_equal_verdicts_are_in_a_stable_order() -> None:
    rows = [vr(B, intent=None), vr(B, intent="rewrite", lang="zh"), vr(B, intent="rewrite")]
    assert [(g.intent, g.language) for g in by_group(rows)] == [
        ("rewrite", "en"), ("rewrite", "zh"), (None, "en")]


def test_no_rows_no_groups() -> None:
    assert by_group([]) == []


def test_the_threshold_table() -> None:
    # Ten classified requests of the route, (p_simple, saving if moved).
    classified = [(0.55, 1.0), (0.62, 1.0), (0.75, 2.0), (0.8, 2.0), (0.82, 2.0),
                  (0.88, 3.0), (0.91, 3.0), (0.93, 3.0), (0.97, 4.0), (0.99, 4.0)]
    rows = [vr(W, p=0.81), vr(W, p=0.84), vr(T, p=0.86), vr(B, p=0.9), vr(T, p=0.92),
            vr(B, p=0.96), vr(None, p=0.97), vr(B, p=None)]  # p unknown: below every level
    got = {t.min_confidence: t for t in thresholds(classified, rows)}
    assert list(got) == [0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95]
    assert got[0.5] == Threshold(0.5, 1.0, 6, 4 / 6, *wilson(4, 6), 25.0)
    assert got[0.8] == Threshold(0.8, 0.7, 6, 4 / 6, *wilson(4, 6), 21.0)  # p >= X moves
    assert got[0.85] == Threshold(0.85, 0.5, 4, 1.0, *wilson(4, 4), 17.0)
    assert got[0.9] == Threshold(0.9, 0.4, 3, 1.0, *wilson(3, 3), 14.0)
    assert got[0.95] == Threshold(0.95, 0.2, 1, 1.0, *wilson(1, 1), 8.0)


@pytest.mark.parametrize(("classified", "rows", "share", "verdicts"), [
    ([], [vr(B)], None, 1),  # no classified request in the window: no share
    ([(0.9, 1.0)], [], 1.0, 0),  # no verdict: no rate, the widest interval
    ([(0.1, 1.0)], [vr(B, p=0.1)], 0.0, 0),  # nothing at or above the level
])
def test_threshold_lines_with_nothing_behind_them(
        classified: list[tuple[float, float]], rows: list[VerdictRow], share: float | None,
        verdicts: int) -> None:
    (line,) = thresholds(classified, rows, levels=(0.5,))
    assert math.isnan(line.share_moved) if share is None else line.share_moved == share
    assert line.verdicts == verdicts
    if verdicts == 0:
        assert math.isnan(line.non_loss) and (line.low, line.high) == (0.0, 1.0)
