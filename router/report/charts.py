"""The cost report's charts, drawn as inline SVG for its HTML page (`router.report.render`).

No script and no URL: every mark is an SVG element with its figure in a <title> tooltip,
and every string from the ledger is HTML-escaped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from html import escape
from math import log10
from typing import Any

PALETTE = ("#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04")
COST_COLOR, COUNTERFACTUAL_COLOR = "#0f766e", "#9ca3af"
W, H = 680, 280
LEFT, RIGHT, TOP, BOTTOM = 76, 20, 16, 46


def _svg(title: str, body: list[str], legend: Sequence[tuple[str, str]]) -> str:
    keys = "".join(f"<span><i style='background:{color}'></i>{escape(name)}</span>"
                   for name, color in legend)
    return (f"<svg class='chart' role='img' aria-label='{escape(title)}' width='{W}' "
            f"height='{H}' viewBox='0 0 {W} {H}'><title>{escape(title)}</title>"
            + "".join(body) + f"</svg><p class='legend'>{keys}</p>")


def _scale(lo: float, hi: float, start: float, end: float) -> Callable[[float], float]:
    span = (hi - lo) or 1.0
    return lambda v: start + (v - lo) / span * (end - start)


def _nice_top(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `value` (1 for nothing)."""
    if value <= 0:
        return 1.0
    step = 10.0 ** int(f"{value:e}".split("e")[1])
    return next(m * step for m in (1, 2, 5, 10) if m * step >= value)


def _y_axis(y: Callable[[float], float], ticks: Sequence[tuple[float, str]]) -> list[str]:
    out = []
    for value, label in ticks:
        py = y(value)
        out.append(f"<line x1='{LEFT}' x2='{W - RIGHT}' y1='{py:.1f}' y2='{py:.1f}' "
                   f"stroke='#e5e7eb'/><text x='{LEFT - 6}' y='{py + 4:.1f}' "
                   f"text-anchor='end'>{escape(label)}</text>")
    return out


def _x_label(x: float, label: str, anchor: str = "middle") -> str:
    return (f"<text x='{x:.1f}' y='{H - BOTTOM + 16}' text-anchor='{anchor}'>"
            f"{escape(label)}</text>")


def cost_chart(report: dict[str, Any]) -> str:
    arms, currency = report["arms"], report["header"]["currency"]
    top = _nice_top(max(max(a["cost"], a["counterfactual_cost"]) for a in arms))
    y = _scale(0, top, H - BOTTOM, TOP)
    body = _y_axis(y, [(top * i / 4, f"{top * i / 4:,.4g}") for i in range(5)])
    slot = (W - LEFT - RIGHT) / len(arms)
    bar = min(56.0, slot * 0.32)
    for i, arm in enumerate(arms):
        middle = LEFT + slot * (i + 0.5)
        for offset, key, color in ((-bar - 2, "cost", COST_COLOR),
                                   (2, "counterfactual_cost", COUNTERFACTUAL_COLOR)):
            value = arm[key]
            tip = f"{arm['arm']}: {key.replace('_', ' ')} {value:,.4f} {currency}"
            left = middle + offset
            body.append(f"<rect class='mark bar' x='{left:.1f}' y='{y(value):.1f}' "
                        f"width='{bar:.1f}' height='{y(0) - y(value):.1f}' fill='{color}'>"
                        f"<title>{escape(tip)}</title></rect><text x='{left + bar / 2:.1f}' "
                        f"y='{y(value) - 4:.1f}' text-anchor='middle'>{value:,.4g}</text>")
        body.append(_x_label(middle, arm["arm"]))
    legend = [("cost", COST_COLOR), ("all on the primary (counterfactual)", COUNTERFACTUAL_COLOR)]
    return _svg(f"Total cost per arm and its all-primary counterfactual ({currency})", body,
                legend)


def wait_chart(report: dict[str, Any]) -> str:
    """The distribution of queue waits per arm as a CDF, x on a log(1 + ms) scale."""
    arms = [a for a in report["arms"] if a["queue_wait_percentiles_ms"]]
    longest = max((a["queue_wait_percentiles_ms"][-1] for a in arms), default=0.0)
    top = _nice_top(max(longest, 1.0))
    log_x = _scale(0, _log1p10(top), LEFT, W - RIGHT)

    def x(ms: float) -> float:
        return log_x(_log1p10(ms))

    y = _scale(0, 1, H - BOTTOM, TOP)
    body = _y_axis(y, [(q / 4, f"{25 * q}%") for q in range(5)])
    ticks = [0.0] + [10.0 ** k for k in range(6) if 10.0 ** k <= top]
    body += [_x_label(x(t), f"{t / 1000:g} s" if t >= 1000 else f"{t:g} ms") for t in ticks]
    for arm in arms:
        color = _arm_color(report, arm["arm"])
        values = arm["queue_wait_percentiles_ms"]
        points = " L".join(f"{x(v):.1f},{y(p / 100):.1f}" for p, v in enumerate(values))
        body.append(f"<path class='mark line' d='M{points}' fill='none' stroke='{color}' "
                    f"stroke-width='2'><title>{escape(arm['arm'])}</title></path>")
        for p in (50, 95):
            tip = f"{arm['arm']}: p{p} {values[p]:,.1f} ms"
            body.append(_point(x(values[p]), y(p / 100), color, tip))
    return _svg("Queue wait per arm: share of requests that waited at most x (CDF)", body,
                [(a["arm"], _arm_color(report, a["arm"])) for a in arms])


def share_chart(report: dict[str, Any]) -> str:
    ts = report["timeseries"]
    n = len(ts["starts"])
    x = _scale(-0.5, n - 0.5, LEFT, W - RIGHT)
    y = _scale(0, 1, H - BOTTOM, TOP)
    body = _y_axis(y, [(q / 4, f"{25 * q}%") for q in range(5)])
    edges = [(-0.5, ts["first_ts"], "start"), ((n - 1) / 2, (ts["first_ts"] + ts["last_ts"]) / 2,
              "middle"), (n - 0.5, ts["last_ts"], "end")]
    body += [_x_label(x(i), _clock(t), anchor) for i, t, anchor in edges]
    for arm in ts["arms"]:
        color = _arm_color(report, arm["arm"])
        for segment in _segments(arm["fallback_share"]):
            d = " L".join(f"{x(i):.1f},{y(s):.1f}" for i, s in segment)
            body.append(f"<path class='mark line' d='M{d}' fill='none' stroke='{color}' "
                        f"stroke-width='2'><title>{escape(arm['arm'])}</title></path>")
        for i, share in enumerate(arm["fallback_share"]):
            if share is not None:
                tip = f"{arm['arm']}: {100 * share:.1f}% of {arm['requests'][i]:,} requests"
                body.append(_point(x(i), y(share), color, tip))
    return _svg("Share served by fallback per time bucket and arm", body,
                [(a["arm"], _arm_color(report, a["arm"])) for a in ts["arms"]])


def _segments(shares: Sequence[float | None]) -> list[list[tuple[int, float]]]:
    """Runs of defined values, so a bucket with nothing served leaves a gap in the line."""
    runs: list[list[tuple[int, float]]] = [[]]
    for i, share in enumerate(shares):
        if share is None:
            runs.append([])
        else:
            runs[-1].append((i, share))
    return [run for run in runs if len(run) > 1]


def _point(x: float, y: float, color: str, tip: str) -> str:
    return (f"<circle class='mark point' cx='{x:.1f}' cy='{y:.1f}' r='3.5' fill='{color}'>"
            f"<title>{escape(tip)}</title></circle>")


def _arm_color(report: dict[str, Any], arm: str) -> str:
    return PALETTE[report["header"]["arms"].index(arm) % len(PALETTE)]


def _log1p10(ms: float) -> float:
    return log10(1 + ms)


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")
