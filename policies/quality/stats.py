"""The quality of downgrades in figures (#33): non-loss rates of the judged shadows per
route, intent and language with Wilson intervals, and the table "if min_confidence were X".
Pure: no I/O, no clock.

A verdict is a non-loss when the small model's answer was judged better than the primary's
or as good (BETTER or TIE). Rows without a verdict (the judge's reply could not be read)
are counted apart and left out of every rate. A rate over no verdict is NaN, its interval
(0, 1).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from math import fsum, nan, sqrt

from policies.quality.judging import Verdict

Z_95 = 1.96  # the standard normal quantile of a two-sided 95 % interval
LEVELS: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)


def wilson(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a proportion `successes` / `n`; (0, 1) when n is 0.
    Unlike the normal approximation it stays within [0, 1] and is not empty at 0 or n."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"successes ({successes}) must be within 0..n ({n})")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True, slots=True)
class VerdictRow:
    """One judged shadow, as stored."""

    ts: float
    route: str
    intent: str | None
    language: str
    p_simple: float | None
    prompt_tokens: int
    verdict: Verdict | None  # None: the judge's reply could not be read
    saved: float  # what the downgrade saved on this request


@dataclass(frozen=True, slots=True)
class Group:
    """The verdicts of one (route, intent, language)."""

    route: str
    intent: str | None
    language: str
    verdicts: int
    no_verdict: int
    non_loss: float  # (BETTER + TIE) / verdicts; NaN without a verdict
    low: float
    high: float
    saved: float  # over all the group's rows, with a verdict or not


@dataclass(frozen=True, slots=True)
class Threshold:
    """The route as it would be with `min_confidence` at this level."""

    min_confidence: float
    share_moved: float  # of the classified requests, those at or above the level; NaN of none
    verdicts: int  # behind non_loss: the verdicts of requests at or above the level
    non_loss: float
    low: float
    high: float
    saved: float  # the savings of the classified requests at or above the level


def non_loss(rows: Sequence[VerdictRow]) -> tuple[int, float, float, float]:
    """(verdicts, non-loss rate, low, high) of the rows with a verdict."""
    judged = [r.verdict for r in rows if r.verdict is not None]
    wins = sum(1 for v in judged if v is not Verdict.WORSE)
    low, high = wilson(wins, len(judged))
    return len(judged), wins / len(judged) if judged else nan, low, high


def by_group(rows: Sequence[VerdictRow]) -> list[Group]:
    """One Group per (route, intent, language), by route, then most verdicts first (then
    intent and language, a missing intent last)."""
    found: dict[tuple[str, str | None, str], list[VerdictRow]] = defaultdict(list)
    for r in rows:
        found[(r.route, r.intent, r.language)].append(r)
    groups = []
    for (route, intent, lang), members in found.items():
        verdicts, rate, low, high = non_loss(members)
        groups.append(Group(route, intent, lang, verdicts, len(members) - verdicts, rate,
                            low, high, fsum(r.saved for r in members)))
    return sorted(groups, key=lambda g: (g.route, -g.verdicts, g.intent is None,
                                         g.intent or "", g.language))


def thresholds(classified: Sequence[tuple[float, float]], rows: Sequence[VerdictRow],
               levels: Sequence[float] = LEVELS) -> list[Threshold]:
    """One route's table "if min_confidence were X", a line per level X.

    `classified`: (p_simple, saving if moved) of each of the route's classified requests;
    share_moved and saved are over those with p_simple >= X, the non-loss rate and its
    interval over `rows` (the route's verdicts) with p_simple >= X.
    """
    out = []
    for level in levels:
        moved = [saving for p, saving in classified if p >= level]
        verdicts, rate, low, high = non_loss(
            [r for r in rows if r.p_simple is not None and r.p_simple >= level])
        share = len(moved) / len(classified) if classified else nan
        out.append(Threshold(level, share, verdicts, rate, low, high, fsum(moved)))
    return out
