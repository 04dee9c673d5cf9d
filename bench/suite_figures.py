"""The suite's figures: per-target medians and spread over the rounds, the ratios taken
within each round, the Redis figures, and the checks against the issue's targets."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

Result = dict[str, Any]


def spread(values: Sequence[float]) -> Result | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
            "n": len(vals)}


def _cells(result: Result, phase: str, target: str, key: str) -> list[float | None]:
    """One value per round (None where the round failed or lacks the target)."""
    out: list[float | None] = []
    for row in result.get("rounds", []):
        cell = row.get(phase, {}).get(target)
        out.append(None if not cell or "error" in cell else cell.get(key))
    return out


def _pairwise(result: Result, phase: str, key: str, a: str, b: str,
              op: Callable[[float, float], float]) -> list[float]:
    out = []
    for x, y in zip(_cells(result, phase, a, key), _cells(result, phase, b, key), strict=True):
        if x is not None and y is not None and (y or op is _diff):
            out.append(op(x, y))
    return out


def _diff(x: float, y: float) -> float:
    return x - y


def _ratio(x: float, y: float) -> float:
    return x / y


# (label, phase, key, unit): the per-target rows; "+" rows are differences to direct
ROWS: tuple[tuple[str, str, str, str], ...] = (
    ("latency c=1, p50", "latency_c1", "p50_ms", "ms"),
    ("latency c=1, p99", "latency_c1", "p99_ms", "ms"),
    ("+ added latency c=1, p50", "latency_c1", "p50_ms", "ms"),
    ("+ added latency c=1, p99", "latency_c1", "p99_ms", "ms"),
    ("requests/s c=64 (wrk)", "throughput_c64", "rps", "/s"),
    ("p99 at c=64", "throughput_c64", "p99_ms", "ms"),
    ("server CPU per request, c=64", "throughput_c64", "cpu_us_per_request", "us"),
    ("server busy at c=64 (share of a core)", "throughput_c64", "server_busy", "x"),
    ("CPU 1 busy at c=64 (wrk + mock)", "throughput_c64", "load_busy", "x"),
    ("stream chunks/s, c=16 x 200 chunks", "stream_c16", "chunks_per_s", "/s"),
    ("time to first chunk, p50", "stream_c16", "ttfc_p50_ms", "ms"),
    ("+ added time to first chunk, p50", "stream_c16", "ttfc_p50_ms", "ms"),
    ("time to first chunk, p99", "stream_c16", "ttfc_p99_ms", "ms"),
    ("server CPU per chunk", "stream_c16", "cpu_us_per_chunk", "us"),
    ("server busy, streams (share of a core)", "stream_c16", "server_busy", "x"),
    ("CPU 1 busy, streams (client + mock)", "stream_c16", "load_busy", "x"),
)
RATIO_ROWS: tuple[tuple[str, str, str], ...] = (
    ("latency c=1, p50", "latency_c1", "p50_ms"),
    ("latency c=1, p99", "latency_c1", "p99_ms"),
    ("requests/s c=64", "throughput_c64", "rps"),
    ("p99 at c=64", "throughput_c64", "p99_ms"),
    ("CPU per request c=64", "throughput_c64", "cpu_us_per_request"),
    ("stream chunks/s c=16", "stream_c16", "chunks_per_s"),
    ("time to first chunk p50", "stream_c16", "ttfc_p50_ms"),
    ("CPU per chunk", "stream_c16", "cpu_us_per_chunk"),
)


def figures(result: Result) -> Result:
    targets: list[str] = result.get("targets", [])
    per_target: dict[str, dict[str, Result | None]] = {}
    for label, phase, key, _unit in ROWS:
        per_target[label] = {}
        for t in targets:
            if label.startswith("+"):
                values = _pairwise(result, phase, key, t, "direct", _diff) if t != "direct" \
                    else []
            else:
                values = [v for v in _cells(result, phase, t, key) if v is not None]
            per_target[label][t] = spread(values)
    peak = result.get("peak_rss_mib", {})
    pairs = [(t, "direct") for t in targets if t != "direct"]
    pairs += [("slotgate", p) for p in targets if p not in ("direct", "slotgate")]
    ratios: dict[str, dict[str, Result | None]] = {}
    for label, phase, key in RATIO_ROWS:
        ratios[label] = {f"{a} / {b}": spread(_pairwise(result, phase, key, a, b, _ratio))
                         for a, b in pairs}
    ratios["peak RSS"] = {f"{a} / {b}": ({"median": peak[a] / peak[b], "min": peak[a] / peak[b],
                                          "max": peak[a] / peak[b], "n": 1}
                                         if peak.get(a) and peak.get(b) else None)
                          for a, b in pairs}
    return {"per_target": per_target, "ratios": ratios, "targets": targets,
            "pairs": [f"{a} / {b}" for a, b in pairs]}


def redis_figures(redis: Result | None) -> Result | None:
    if not redis:
        return None
    rows = redis["rounds"]
    one = spread([r["rps"] for r in rows.get(1, rows.get("1", []))])
    two = spread([r["rps"] for r in rows.get(2, rows.get("2", []))])
    cpu1 = spread([r["cpu_us_per_request"] for r in rows.get(1, rows.get("1", []))])
    cpu2 = spread([r["cpu_us_per_request"] for r in rows.get(2, rows.get("2", []))])
    ratio = two["median"] / one["median"] if one and two and one["median"] else None
    return {"rps_1": one, "rps_2": two, "ratio": ratio, "cpu_1": cpu1, "cpu_2": cpu2}


def target_checks(result: Result, fig: Result) -> list[tuple[str, str, str, bool | None]]:
    """The issue's targets: (target, limit, measured, met); None where not measured."""
    pt = fig["per_target"]

    def med(label: str, target: str = "slotgate") -> float | None:
        cell = pt.get(label, {}).get(target)
        return cell["median"] if cell else None

    checks: list[tuple[str, str, str, bool | None]] = []

    def check(name: str, value: float | None, op: str, limit: float, fmt: str,
              note: str = "") -> None:
        if value is None:
            checks.append((name, f"{op} {limit:g}", "not measured", None))
            return
        ok = value <= limit if op == "<=" else value >= limit
        checks.append((name, f"{op} {limit:g}", fmt.format(value) + note, ok))

    check("added latency c=1 p50 (ms)", med("+ added latency c=1, p50"), "<=", 0.5, "{:.2f}")
    check("added latency c=1 p99 (ms)", med("+ added latency c=1, p99"), "<=", 2.0, "{:.2f}")
    check("requests/s at c=64, one process", med("requests/s c=64 (wrk)"), ">=", 4000, "{:,.0f}")
    floor = fig["ratios"].get("requests/s c=64", {}).get("slotgate / aiohttp")
    check("requests/s vs bare aiohttp pass-through (ratio)",
          floor["median"] if floor else None, ">=", 0.5, "x{:.2f}")
    chunks = fig["ratios"]["stream chunks/s c=16"].get("slotgate / nginx")
    per_chunk = fig["ratios"]["CPU per chunk"].get("slotgate / nginx")
    check("stream chunks/s vs nginx (ratio)", chunks["median"] if chunks else None, ">=", 1.0,
          "x{:.2f}", f" (CPU per chunk x{per_chunk['median']:.2f} of nginx's)"
          if per_chunk else "")
    nginx_ttfc = med("+ added time to first chunk, p50", "nginx")
    check("added time to first chunk p50 (ms)", med("+ added time to first chunk, p50"), "<=",
          1.0, "{:.2f}", f" (nginx {nginx_ttfc:+.2f})" if nginx_ttfc is not None else "")
    check("peak RSS (MiB)", result.get("peak_rss_mib", {}).get("slotgate"), "<=", 100, "{:.1f}")
    queue = (result.get("saturation") or {}).get("queue_memory") or {}
    check("memory per queued request (KiB)", queue.get("kib_per_request"), "<=", 20, "{:.1f}")
    check("suite time (min)", result.get("elapsed_s", 0) / 60 or None, "<=", 15, "{:.1f}")
    return checks

