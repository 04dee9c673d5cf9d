"""The quality of downgrades in `slotgate report` (#33): the judge's verdicts on shadowed
downgrades per route, intent and language, and per route the table "if min_confidence were
X", beside what the moves save.

- groups: `policies.quality.stats.by_group` over the window's verdicts (of this release's
  judge version; others are counted in `other_versions`, never pooled). `saved` is the sum
  of the judged requests' savings, as the shadow runner recorded them.
- thresholds: per route with verdicts, over the window's classified requests of the route
  (served, p_simple recorded, an intent the route may move, not a batch line): their
  share at or above X, and what moving them saves. A request that was moved saves what the
  ledger says (counterfactual_cost - cost); one the primary served saves its cost less the
  small backend's for the same request: the same tokens at a per-token price, the same slot
  time at a GPU-time price (an upper bound of the small model's, which answers faster).
  Without the route's small backend in the config the savings are unknown (None).

Present only when the window holds verdicts, so a report without shadows is as it was.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from policies.config import Config, FallbackWhen, PriceConfig
from policies.pricing.costs import request_cost
from policies.quality.judging import JUDGE_VERSION
from policies.quality.stats import LEVELS, Z_95, VerdictRow, by_group, thresholds
from router.ledger.base import LedgerRow, RowFilter, Store
from router.quality import verdicts


@dataclass(frozen=True, slots=True)
class Downgrade:
    """What the config says of a route's downgrades."""

    small: str | None  # the first fallback: where its simple requests go
    price: PriceConfig | None  # the small backend's
    slots: int
    intents: frozenset[str]  # the intents it may move
    min_confidence: float | None  # in force; None when it never moves simple requests


@dataclass(frozen=True, slots=True)
class QualityInputs:
    verdicts: Sequence[VerdictRow]
    downgrades: Mapping[str, Downgrade]  # by route
    other_versions: int = 0  # verdicts of the window by another judge version


def downgrades(config: Config) -> dict[str, Downgrade]:
    """Each route's downgrade, from the config."""
    out = {}
    for name, route in config.routes.items():
        small = route.fallbacks[0] if route.fallbacks else None
        backend = config.backends.get(small) if small is not None else None
        out[name] = Downgrade(
            small, None if backend is None else backend.price,
            1 if backend is None else backend.slots, frozenset(route.fallback.intents),
            None if route.fallback.when is FallbackWhen.NEVER else route.fallback.min_confidence)
    return out


async def load(store: Store, config: Config, where: RowFilter) -> QualityInputs:
    """The window's verdicts (of the filter's route, if any) and the config's downgrades."""
    rows = await verdicts.fetch(store, where.since, where.until, where.route)
    others = await verdicts.other_versions(store, where.since, where.until, where.route)
    return QualityInputs(rows, downgrades(config), others)


def move_saving(row: LedgerRow, down: Downgrade | None) -> float | None:
    """What moving this served request to the small backend saves (saved, if it moved);
    None when the small backend is unknown."""
    if row.backend != row.primary:
        return row.counterfactual_cost - row.cost
    if down is None or down.small is None:
        return None
    small = request_cost(down.price, down.slots, row.prompt_tokens, row.completion_tokens,
                         row.slot_ms / 1000, bool(row.batch))
    return row.cost - small


def quality_breakdown(rows: Sequence[LedgerRow],
                      inputs: QualityInputs) -> dict[str, Any] | None:
    """{"judge_version", "groups", "routes", ...}; None when there is no verdict."""
    if not inputs.verdicts:
        return None
    judged = inputs.verdicts
    return {
        "judge_version": JUDGE_VERSION,
        "other_versions": inputs.other_versions,
        "ci_level": 0.95, "z": Z_95,
        "verdicts": sum(1 for v in judged if v.verdict is not None),
        "no_verdict": sum(1 for v in judged if v.verdict is None),
        "groups": [_plain(asdict(g)) for g in by_group(judged)],
        "routes": [_route(name, rows, [v for v in judged if v.route == name],
                          inputs.downgrades.get(name))
                   for name in sorted({v.route for v in judged})],
    }


def _route(name: str, rows: Sequence[LedgerRow], judged: Sequence[VerdictRow],
           down: Downgrade | None) -> dict[str, Any]:
    classified = [r for r in rows if r.route == name and r.p_simple is not None
                  and r.status == 200 and r.backend is not None and not r.batch
                  and (down is None or r.intent in down.intents)]
    savings = [move_saving(r, down) for r in classified]
    priced = all(s is not None for s in savings)
    pairs = [(float(r.p_simple or 0.0), s or 0.0) for r, s in zip(classified, savings,
                                                                 strict=True)]
    lines = [_plain(asdict(t)) for t in thresholds(pairs, judged, LEVELS)]
    if not priced:
        for line in lines:
            line["saved"] = None
    return {"route": name, "small_backend": None if down is None else down.small,
            "min_confidence": None if down is None else down.min_confidence,
            "classified": len(classified), "saved_known": priced, "thresholds": lines}


def _plain(figures: dict[str, Any]) -> dict[str, Any]:
    """NaN (a rate over nothing) as None, as JSON has it."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v
            for k, v in figures.items()}
