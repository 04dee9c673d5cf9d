"""The TTFT objectives' attainment in `slotgate report`: per experiment arm and per class.

Rows are judged as the gateway judged them (`policies.clock.slo.verdict`): attained when the
first token came within the row's objective (`ttft_ms <= slo_ttft_ms`), missed when it
came later or never came (rejected, timed out, failed), not judged when the client left
before its objective was due and before a first token. Rows without an objective (written
before the ledger kept one, or refused before their route was known) are left out; with
none at all the report has no "slo" key, so an older ledger's report is unchanged.

`attainment` is attained / judged (None when nothing was judged); the class "all" sums the
classes of its group.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from policies.clock.slo import Verdict, verdict
from policies.config import Priority
from router.ledger.base import LedgerRow

ALL_CLASSES = "all"
NO_ARM = "(none)"


def slo_breakdown(rows: Sequence[LedgerRow]) -> dict[str, Any] | None:
    """{"total": [classes], "arms": [{"arm", "classes": [...]}]}, or None (no objectives)."""
    kept = [r for r in rows if r.slo_ttft_ms is not None]
    if not kept:
        return None
    by_arm: dict[str, list[LedgerRow]] = defaultdict(list)
    for r in kept:
        by_arm[r.arm if r.arm is not None else NO_ARM].append(r)
    names = sorted(a for a in by_arm if a != NO_ARM) + ([NO_ARM] if NO_ARM in by_arm else [])
    return {"total": class_figures(kept),
            "arms": [{"arm": name, "classes": class_figures(by_arm[name])} for name in names]}


def class_figures(rows: Sequence[LedgerRow]) -> list[dict[str, Any]]:
    """The figures of all the rows ("all"), then of each class present, highest first."""
    by_class: dict[str, list[LedgerRow]] = defaultdict(list)
    for r in rows:
        by_class[r.priority or Priority.STANDARD.value].append(r)
    order = [p.value for p in Priority] + sorted(set(by_class) - {p.value for p in Priority})
    return [_figures(ALL_CLASSES, rows),
            *(_figures(name, by_class[name]) for name in order if name in by_class)]


def row_verdict(row: LedgerRow) -> Verdict | None:
    return verdict(row.slo_ttft_ms, row.ttft_ms, row.total_ms,
                   client_left=row.disconnect is not None or row.status == 499)


def _figures(name: str, rows: Iterable[LedgerRow]) -> dict[str, Any]:
    requests = attained = missed = 0
    objectives: set[float] = set()
    for r in rows:
        requests += 1
        if r.slo_ttft_ms is not None:
            objectives.add(r.slo_ttft_ms)
        judged = row_verdict(r)
        attained += judged is Verdict.ATTAINED
        missed += judged is Verdict.MISSED
    judged_n = attained + missed
    return {"class": name, "objectives_ms": sorted(objectives), "requests": requests,
            "judged": judged_n, "attained": attained, "missed": missed,
            "attainment": attained / judged_n if judged_n else None}
