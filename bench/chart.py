"""The suite's chart: latency at c=1 and throughput per target, as one PNG.

    bench/.venv-tools/bin/python bench/chart.py DATA.json docs/bench-peers.png

Run by bench/suite.py with the interpreter of bench/.venv-tools (matplotlib lives there,
not in the project's venv). DATA holds, per figure, {target: {median, min, max} | null}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLOURS = {"direct": "#9e9e9e", "slotgate": "#1f77b4", "aiohttp": "#9467bd",
           "litellm": "#d62728", "nginx": "#2ca02c"}


def _bars(ax: Any, targets: list[str], cells: dict[str, Any], title: str, unit: str,
          offset: float = 0.0, width: float = 0.8, hatch: str = "", label: bool = True) -> None:
    xs, heights, lows, highs, tops, colours = [], [], [], [], [], []
    for i, t in enumerate(targets):
        c = cells.get(t)
        if not c or c["median"] <= 0:
            continue
        xs.append(i + offset)
        heights.append(c["median"])
        lows.append(max(c["median"] - c["min"], 0))
        highs.append(max(c["max"] - c["median"], 0))
        tops.append(max(c["max"], c["median"]))
        colours.append(COLOURS.get(t, "#7f7f7f"))
    ax.bar(xs, heights, width=width, color=colours, hatch=hatch, edgecolor="white",
           yerr=[lows, highs], capsize=3, error_kw={"elinewidth": 1, "ecolor": "#333333"})
    if label:
        for x, h, top in zip(xs, heights, tops, strict=True):
            text = f"{h:,.0f}" if h >= 100 else (f"{h:.1f}" if h >= 10 else f"{h:.2f}")
            ax.annotate(text, (x, top), textcoords="offset points", xytext=(0, 3),
                        ha="center", fontsize=8)
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(unit, fontsize=9)
    ax.set_xticks(range(len(targets)), targets, fontsize=9)
    ax.grid(axis="y", which="major", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    data = json.loads(Path(argv[0]).read_text())
    targets: list[str] = data["targets"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    _bars(axes[0], targets, data["p50"], "latency at c=1: p50 (solid), p99 (hatched)",
          "ms (log)", offset=-0.2, width=0.4)
    _bars(axes[0], targets, data["p99"], "latency at c=1: p50 (solid), p99 (hatched)",
          "ms (log)", offset=0.2, width=0.4, hatch="//")
    _bars(axes[1], targets, data["rps"], "requests/s at c=64 (wrk)", "requests/s (log)")
    _bars(axes[2], targets, data["chunks"], "stream chunks/s at c=16, 200 chunks",
          "chunks/s (log)")
    fig.suptitle(data["title"] + "; bars: median, whiskers: lowest and highest round",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(argv[1], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
