"""The load-step bench's output (bench/load_step.py): one row per second as CSV, and a PNG
of four stacked panels sharing the time axis: the offered load, the desired count beside
the replicas in service, the line, and the time to first token."""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


@dataclass(frozen=True)
class Second:
    """The bench's view of one second, from its start."""

    t: int
    nominal: float  # the schedule's rate, in one replica's capacity
    offered: float  # the requests that arrived in it, in one replica's capacity
    desired: int  # the gateway's count at the second's end
    listed: int  # replicas in the config (the autoscaler's)
    starting: int  # replicas the autoscaler is starting
    ready: int  # in service and healthy (the dashboard's figure)
    draining: int
    queued: int  # at the second's end
    queue_peak: int  # the most in line during it
    ttft_p95_s: float | None  # of the requests that arrived in it
    requests: int


def write_csv(path: Path, rows: list[Second]) -> None:
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, [f.name for f in fields(Second)])
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else round(v, 3) if isinstance(v, float)
                                 else v) for k, v in asdict(row).items()})


@dataclass(frozen=True)
class Marks:
    """Where the plot draws its vertical lines (seconds from the start)."""

    up: float
    down: float
    in_service: float | None


def draw(path: Path, rows: list[Second], marks: Marks, title: str) -> None:
    ts = [r.t + 0.5 for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(9, 9.5), sharex=True,
                             gridspec_kw={"height_ratios": [1, 1.2, 1, 1]})
    load, fleet, line, ttft = axes
    load.bar(ts, [r.offered for r in rows], width=1.0, color="#c6dbef", label="arrived")
    load.step([r.t for r in rows], [r.nominal for r in rows], where="post", color="#08519c",
              label="offered (schedule)")
    load.set_ylabel("load (x one\nreplica's capacity)", fontsize=9)
    fleet.step([r.t + 1 for r in rows], [r.desired for r in rows], where="pre",
               color="#d62728", label="desired (slotgate_desired_replicas)")
    fleet.step([r.t + 1 for r in rows], [r.ready for r in rows], where="pre",
               color="#2ca02c", label="replicas in service")
    fleet.step([r.t + 1 for r in rows], [r.listed + r.starting for r in rows], where="pre",
               color="#9e9e9e", linestyle=":", label="in service + starting")
    fleet.bar([r.t + 0.5 for r in rows], [r.draining for r in rows], width=1.0,
              color="#fdae6b", label="draining (running out what they hold)")
    fleet.set_ylabel("replicas", fontsize=9)
    fleet.set_ylim(0, max(max(r.desired, r.listed + r.starting) for r in rows) + 1)
    line.fill_between([r.t + 1 for r in rows], [r.queue_peak for r in rows], step="pre",
                      color="#fdd0a2", label="most in line in the second")
    line.step([r.t + 1 for r in rows], [r.queued for r in rows], where="pre",
              color="#e6550d", label="in line at its end")
    line.set_ylabel("queue length", fontsize=9)
    shown = [(t, r.ttft_p95_s) for t, r in zip(ts, rows, strict=True)
             if r.ttft_p95_s is not None]
    ttft.plot([t for t, _ in shown], [v for _, v in shown], ".-", color="#6a51a3",
              markersize=3, linewidth=1, label="p95 of the second's arrivals")
    ttft.set_ylabel("time to first\ntoken (s)", fontsize=9)
    ttft.set_xlabel("seconds", fontsize=9)
    _mark(axes, marks)
    top = load.get_ylim()[1]
    for at, text in ((marks.up, "step up"), (marks.down, "step down"),
                     (marks.in_service, "needed replicas in service")):
        if at is not None:
            load.annotate(text, (at, top), xytext=(3, -10), textcoords="offset points",
                          fontsize=7, color="#333333")
    load.set_title(title, fontsize=9.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mark(axes: Any, marks: Marks) -> None:
    for ax in axes:
        ax.axvline(marks.up, color="#555555", linewidth=0.8, linestyle="--")
        ax.axvline(marks.down, color="#555555", linewidth=0.8, linestyle="--")
        if marks.in_service is not None:
            ax.axvline(marks.in_service, color="#2ca02c", linewidth=0.8, linestyle="--")
        ax.grid(alpha=0.3)
        ax.spines[["top", "right"]].set_visible(False)
        ax.legend(loc="upper right", fontsize=8, frameon=False)
        ax.tick_params(labelsize=8)
