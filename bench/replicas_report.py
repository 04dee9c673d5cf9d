"""The replica bench's figures: one run's row, and the report of many (every run, each
cell's medians over the seeds, the ratios of the median per-seed ratios). Used by
bench/replicas.py."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

SGLANG = "sglang"  # sglang-router, --policy cache_aware


@dataclass
class Row:
    arm: str
    tenants: int
    load: float
    seed: int
    p50: float
    p99: float
    engine_p50: float  # the engines' planned TTFT: the prefix cache's share of it
    engine_p99: float
    hit: float
    cold: int  # requests that prefilled 1,000 tokens or more (a system prompt not cached)
    kept: float  # later turns served by the replica that served the session's turn before
    queued: float  # requests that waited in an engine's own line for a sequence
    max_mean_requests: float
    max_mean_tokens: float
    busy: float  # engine busy time over slot time of the run
    service_s: float  # mean engine time per request
    failed: int
    picks: dict[str, int] = field(default_factory=dict)  # "waited": queued at the gateway

    @property
    def waited(self) -> float | None:
        """Requests that waited in the router's line (slotgate's; sglang-router has none)."""
        if self.arm == SGLANG:
            return None
        return self.picks.get("waited", 0) / max(sum(self.picks.values()), 1)


FIGURES = (  # (label, Row attribute, format)
    ("TTFT p50 (s)", "p50", "{:.3f}"), ("TTFT p99 (s)", "p99", "{:.3f}"),
    ("engine TTFT p50", "engine_p50", "{:.3f}"), ("engine TTFT p99", "engine_p99", "{:.3f}"),
    ("prefix hits", "hit", "{:.0%}"), ("cold", "cold", "{:.0f}"),
    ("later turns kept", "kept", "{:.0%}"), ("queued at engines", "queued", "{:.0%}"),
    ("waited at router", "waited", "{:.0%}"), ("max/mean requests", "max_mean_requests",
                                                "{:.2f}"),
    ("failed", "failed", "{:.0f}"),
)
RATIOS = (("TTFT p50", "p50"), ("TTFT p99", "p99"), ("cold", "cold"))
PAIRS = (("affinity", SGLANG), ("affinity", "least_loaded"))


def _show(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def cells(rows: Sequence[Row]) -> list[tuple[int, float]]:
    return sorted({(r.tenants, r.load) for r in rows}, key=lambda c: (-c[0], c[1]))


def ratios(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """Per cell and pair, each figure's per-seed ratios and their median."""
    out = []
    for tenants, load in cells(rows):
        for mine, theirs in PAIRS:
            entry: dict[str, Any] = {"tenants": tenants, "load": load, "arm": mine,
                                     "vs": theirs}
            for label, key in RATIOS:
                per_seed = []
                for seed in sorted({r.seed for r in rows}):
                    at = {r.arm: r for r in rows
                          if (r.tenants, r.load, r.seed) == (tenants, load, seed)}
                    if mine in at and theirs in at and getattr(at[theirs], key):
                        per_seed.append(getattr(at[mine], key) / getattr(at[theirs], key))
                entry[label] = {"median": _median(per_seed), "per_seed": per_seed}
            if any(entry[label]["per_seed"] for label, _ in RATIOS):
                out.append(entry)
    return out


def report(rows: Sequence[Row], arms: Sequence[str]) -> None:
    order = {arm: i for i, arm in enumerate(arms)}
    print("Every run:\n")
    print("| tenants | load | seed | arm | " + " | ".join(f[0] for f in FIGURES) + " | picks |")
    print("|---" * (len(FIGURES) + 5) + "|")
    for r in sorted(rows, key=lambda r: (-r.tenants, r.load, r.seed, order[r.arm])):
        picks = ", ".join(f"{k} {v}" for k, v in sorted(r.picks.items()) if k != "waited")
        print(f"| {r.tenants} | {r.load:.1f}x | {r.seed} | {r.arm} | "
              + " | ".join(_show(getattr(r, key), fmt) for _, key, fmt in FIGURES)
              + f" | {picks or '-'} |")
    seeds = len({r.seed for r in rows})
    for tenants, load in cells(rows):
        at = [r for r in rows if (r.tenants, r.load) == (tenants, load)]
        print(f"\n{tenants} tenants, {load:.1f}x: median over {seeds} seed(s)\n")
        print("| arm | " + " | ".join(f[0] for f in FIGURES) + " |")
        print("|---" * (len(FIGURES) + 1) + "|")
        for arm in sorted({r.arm for r in at}, key=order.__getitem__):
            mine = [r for r in at if r.arm == arm]
            print(f"| {arm} | " + " | ".join(
                _show(_median([getattr(r, key) for r in mine]), fmt)
                for _, key, fmt in FIGURES) + " |")
    entries = ratios(rows)
    if not entries:
        return
    print("\nRatios, the median of the per-seed ratios (each seed's in brackets):\n")
    print("| tenants | load | ratio | " + " | ".join(label for label, _ in RATIOS) + " |")
    print("|---" * (len(RATIOS) + 3) + "|")
    for entry in entries:
        shown = []
        for label, _ in RATIOS:
            value = entry[label]
            each = ", ".join(f"x{v:.2f}" for v in value["per_seed"])
            shown.append("-" if value["median"] is None else
                         f"x{value['median']:.2f}" + (f" [{each}]" if seeds > 1 else ""))
        print(f"| {entry['tenants']} | {entry['load']:.1f}x | {entry['arm']} / {entry['vs']} "
              f"| " + " | ".join(shown) + " |")
