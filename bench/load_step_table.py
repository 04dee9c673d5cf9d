"""The load-step bench's figures (bench/load_step.py): how long the count and the replicas
took to follow the step, the longest line, and the time to first token around it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from load_step_plot import Second

if TYPE_CHECKING:
    from load_step import Plan, Run


@dataclass(frozen=True)
class Phase:
    name: str
    start: float  # seconds from the start, of the arrivals it counts
    end: float
    p50: float | None
    p95: float | None
    n: int


@dataclass(frozen=True)
class Figures:
    plan: Plan
    capacity: float
    hold_s: float
    slots: int
    requests: int
    refused: int
    looks_up: list[tuple[float, int]]  # after the step up: (seconds after it, desired)
    in_service_s: float | None  # from the step to the needed replicas in service
    queue_gone_s: float | None  # from the step to the line empty again
    peak_queue: tuple[int, int]  # (length, second)
    phases: list[Phase]
    down_floor_s: float | None  # from the step down to the count at the floor
    down_one_s: float | None  # to one replica in service
    extra: float  # replica-seconds in service above the needed count, at 2x
    wall_s: float

    @property
    def in_service_at(self) -> float | None:
        return None if self.in_service_s is None else self.plan.warm_s + self.in_service_s

    def first_look(self, at_least: int) -> tuple[float, int] | None:
        return next(((t, d) for t, d in self.looks_up if d >= at_least), None)


def quantile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else None


def figures(r: Run, rows: list[Second], capacity: float, hold_s: float, slots: int
            ) -> Figures:
    plan, up, down = r.plan, r.plan.warm_s, r.plan.down_at
    looks_up = [(t - up, d) for t, d in r.watch.looks if up <= t < down]
    moved = [(m.at - r.start, m.listed) for m in r.scaler.moves]
    in_service = next((t - up for t, n in moved if t >= up and n >= plan.needed), None)
    gone = None if in_service is None else next(
        (row.t + 1 - up for row in rows if row.t >= up + in_service and row.queued == 0), None)
    peak = max(rows, key=lambda row: row.queue_peak)
    downs = [(t - down, d) for t, d in r.watch.looks if t >= down]
    extra = sum(max(0, row.ready - plan.needed) for row in rows if up <= row.t < down)
    edges = [("before the step (from 5 s)", 5.0, up),
             ("from the step to the replicas", up, up + (in_service or plan.up_s)),
             ("replicas in service, line gone", up + (gone or plan.up_s), down),
             ("after the step down", down, plan.total_s)]
    phases = []
    for name, start, end in edges:
        ttfts = [s.ttft_s for s in r.streams if s.ttft_s is not None
                 and start <= s.sent_at - r.start < end]
        phases.append(Phase(name, start, end, quantile(ttfts, 0.5), quantile(ttfts, 0.95),
                            len(ttfts)))
    return Figures(
        plan, capacity, hold_s, slots, len(r.streams), sum(s.refused for s in r.streams),
        looks_up, in_service, gone, (peak.queue_peak, peak.t), phases,
        next((t for t, d in downs if d <= 1), None),
        next((t - down for t, n in moved if t >= down and n <= 1), None), extra, r.wall_s)


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def print_table(f: Figures) -> None:
    p = f.plan
    print(f"#34 load step: one replica = {f.slots} slots, {f.hold_s:.1f} s hold "
          f"-> {f.capacity:g} requests/s; scaling floor 1, ceiling {p.ceiling}, utilization "
          f"{p.utilization:g}, cool-down {p.cooldown_s:g} s; refresh {p.refresh_s:g} s; "
          f"a replica in service {p.startup_s:g} s after it is asked for")
    print(f"Poisson arrivals: {p.low}x ({p.low * f.capacity:g}/s) for {p.warm_s:g} s, "
          f"{p.high}x ({p.high * f.capacity:g}/s) for {p.up_s:g} s, {p.low}x for "
          f"{p.down_s:g} s; {f.requests} streamed requests, {f.refused} refused; "
          f"run {f.wall_s:.0f} s")
    print(f"the step needs ceil({p.high:g} x {f.slots} / ({f.slots} x {p.utilization:g})) = "
          f"{p.needed} replicas (docs/autoscaling.md)\n")
    moved, needed = f.first_look(2), f.first_look(p.needed)
    most = max((d for _, d in f.looks_up), default=1)
    rows = [("step up, from the step", None),
            ("the count's first move", _s(moved and moved[0]) + (f" (to {moved[1]})" if moved
                                                                  else "")),
            (f"the count at {p.needed} or more", _s(needed and needed[0])
             + (f" (to {needed[1]})" if needed else "")),
            ("the most it asked for", f"{most}{' (the ceiling)' if most >= p.ceiling else ''}"),
            (f"replica-seconds above {p.needed}, at {p.high:g}x", f"{f.extra:g}"),
            (f"{p.needed} replicas in service", _s(f.in_service_s)),
            ("the line empty again", _s(f.queue_gone_s)),
            ("longest line", f"{f.peak_queue[0]} (second {f.peak_queue[1]})"),
            ("step down, from the step", None),
            ("the count at the floor", _s(f.down_floor_s)),
            ("one replica in service", _s(f.down_one_s))]
    for label, value in rows:
        print(label if value is None else f"  {label:<38}{value}")
    print()
    print(f"{'time to first token, by arrival':<38}      n     p50     p95")
    for ph in f.phases:
        p50 = "-" if ph.p50 is None else f"{ph.p50:.2f}"
        p95 = "-" if ph.p95 is None else f"{ph.p95:.2f}"
        print(f"  {ph.name:<36} {ph.n:>7} {p50:>7} {p95:>7}   [{ph.start:.0f}, {ph.end:.0f}) s")
