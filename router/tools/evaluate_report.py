"""What `slotgate evaluate` prints: the verdicts per intent and language and the table "if
min_confidence were X" (policies.quality.stats, as `slotgate report` computes them from
live shadows), as text or JSON. Figures and labels only, never a prompt or an answer.

Unlike live shadows, which follow moved requests only, every prompt is judged: the
threshold table's non-loss below today's threshold is measured, not borrowed.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from policies.config import Config, FallbackWhen
from policies.quality.judging import JUDGE_VERSION
from policies.quality.stats import LEVELS, Z_95, VerdictRow, by_group, thresholds
from router.quality.evaluation import Judged, Outcome, Plan
from router.report.quality_tables import group_head, group_line, threshold_head, threshold_line

_FAILURES = {Outcome.SMALL_FAILED: "the small model's call failed",
             Outcome.REPLAY_FAILED: "the primary's call failed",
             Outcome.REFUSED: "refused by the gateway (lower --concurrency)",
             Outcome.FAILED: "no answer (connection or timeout)"}


def figures(config: Config, plan: Plan, results: Sequence[Judged]) -> dict[str, Any]:
    """The evaluation as plain data (NaN as None): what was compared, the outcomes, the
    groups, the threshold table and one line per prompt."""
    rule = config.routes[plan.route].fallback
    rows = [VerdictRow(0.0, plan.route, r.intent, r.language, r.p_simple, r.prompt_tokens,
                       r.verdict, r.saved)
            for r in results if r.outcome in (Outcome.JUDGED, Outcome.NO_VERDICT)]
    movable = [r for r in rows if r.intent in rule.intents]  # what the route may move
    labelled = [r for r in results if r.label is not None]
    outcomes = Counter(r.outcome.value for r in results)
    return {
        "route": plan.route, "small_backend": plan.small, "primary_backend": plan.primary,
        "judge_backend": plan.judge, "judge_version": JUDGE_VERSION, "ci_level": 0.95,
        "z": Z_95, "prompts": len(results),
        "outcomes": {o.value: outcomes[o.value] for o in Outcome},
        "min_confidence": None if rule.when is FallbackWhen.NEVER else rule.min_confidence,
        "intents": sorted(rule.intents), "classified": len(movable),
        "labelled": len(labelled),
        "labels_agreed": sum(1 for r in labelled if r.label == r.intent),
        "groups": [_plain(asdict(g)) for g in by_group(rows)],
        "thresholds": [_plain(asdict(t)) for t in thresholds(
            [(r.p_simple or 0.0, r.saved) for r in movable], movable, LEVELS)],
        "results": [{**asdict(r), "outcome": r.outcome.value,
                     "verdict": None if r.verdict is None else r.verdict.value}
                    for r in results],
    }


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    return {k: None if isinstance(v, float) and math.isnan(v) else v
            for k, v in values.items()}


def text_lines(found: dict[str, Any], source: str) -> list[str]:
    """The evaluation as a terminal's lines."""
    outcomes = found["outcomes"]
    lines = [f"{found['prompts']:,} prompts of {source} on route {found['route']}: "
             f"{found['small_backend']} (small) against {found['primary_backend']} "
             f"(primary), judged by {found['judge_backend']} ({found['judge_version']}, "
             "both orders)",
             f"{outcomes[Outcome.JUDGED]:,} judged, {outcomes[Outcome.NO_VERDICT]:,} without "
             "a verdict" + "".join(f"; {outcomes[o]:,} {why}" for o, why in _FAILURES.items()
                                   if outcomes[o])]
    if found["groups"]:
        lines += ["", "Verdicts per intent (the classifier's) and language", *textwrap.wrap(
            "Non-loss: share of verdicts judging the small model's answer better or as good "
            "(95% Wilson interval); no verdict: the judge's reply was unreadable; saved: the "
            "primary's answer priced, less the small model's.", 96),
                  group_head("intent")]
        lines += [group_line(g["intent"] or "(none)", g) for g in found["groups"]]
        lines += ["", f"If min_confidence were X: route {found['route']}", *textwrap.wrap(
            f"{found['classified']:,} judged prompts of an intent the route may move. Moved: "
            "their share with p_simple >= X; non-loss: over their verdicts with p_simple "
            ">= X; saved: what moving them saves.", 96), threshold_head()]
        lines += [threshold_line(t, found) for t in found["thresholds"]]
    if found["labelled"]:
        agreed = found["labels_agreed"]
        lines += ["", f"{found['labelled']:,} prompts carry an intent label: the classifier "
                  f"agreed on {agreed:,} ({100 * agreed / found['labelled']:.1f}%)."]
    return lines
