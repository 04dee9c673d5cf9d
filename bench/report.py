"""The benchmark's output: the machine it ran on, the targets, and a compact table."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

Result = dict[str, Any]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine() -> Result:
    return {
        "nproc": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(), "python": platform.python_version(),
        "uvloop": _version("uvloop"), "aiohttp": _version("aiohttp"),
        "loadavg": list(os.getloadavg()),
    }


def targets(r: Result) -> list[Result]:
    """The issue's targets, informative only: (figure, value, limit, pass)."""
    lat = r["latency"]["non_stream"]["added_ms"]
    rows = [
        ("added p50 (ms, non-stream, c=1)", lat["p50"], "<=", 1.0),
        ("added p99 (ms, non-stream, c=1)", lat["p99"], "<=", 5.0),
        ("hand-off p99 (ms, gateway)", r["handoff"]["gateway_ms"]["p99"], "<=", 2.0),
        ("requests/s through the gateway (c=64)", r["throughput"]["gateway_rps"], ">=", 2000.0),
    ]
    return [{"figure": name, "value": value, "limit": f"{op} {limit:g}",
             "pass": value <= limit if op == "<=" else value >= limit}
            for name, value, op, limit in rows]


def _busy(by_target: Result) -> str:
    names = {"gateway": "gw", "simulator": "engine", "client": "client"}
    parts = []
    for target, shares in by_target.items():
        cells = " ".join(f"{names[p]} {v * 100:.0f}%" for p, v in shares.items()
                         if p in names and not (target == "direct" and p == "gateway"))
        parts.append(f"{target}: {cells}")
    return " | ".join(parts)


def _row(label: str, direct: str, gateway: str, delta: str) -> str:
    return f"{label:<38}{direct:>10}{gateway:>10}{delta:>14}"


def _latency_rows(title: str, block: Result) -> list[str]:
    d, g, a = block["direct_ms"], block["gateway_ms"], block["added_ms"]
    return [_row(f"{title} p50 (ms)", f"{d['p50']:.3f}", f"{g['p50']:.3f}", f"{a['p50']:+.3f}"),
            _row(f"{title} p99 (ms)", f"{d['p99']:.3f}", f"{g['p99']:.3f}", f"{a['p99']:+.3f}")]


def table(r: Result) -> list[str]:
    lat, tp, st, ho = r["latency"], r["throughput"], r["stream_relay"], r["handoff"]
    n = lat["non_stream"]["direct_ms"]["n"]
    cpu = tp["cpu_us_per_request"]["gateway"]
    lines = [_row("", "direct", "gateway", "gw - direct"), "-" * 74]
    lines += _latency_rows(f"latency c=1 ({n}/side)", lat["non_stream"])
    lines += _latency_rows("short stream c=1, last byte", lat["short_stream"])
    lines.append(_row(f"requests/s c={tp['concurrency']}", f"{tp['direct_rps']:.0f}",
                      f"{tp['gateway_rps']:.0f}", f"x{tp['ratio']:.2f}"))
    lines.append(_row(f"stream events/s ({st['clients']}x{st['tokens']} tok)",
                      f"{st['direct']['events_per_s']:.0f}",
                      f"{st['gateway']['events_per_s']:.0f}", f"x{st['ratio']:.2f}"))
    lines += _latency_rows(f"slot hand-off ({ho['clients']} clients)", ho)
    lines += [
        "",
        f"gateway CPU per request at c={tp['concurrency']}: {cpu.get('gateway', 0):.0f} us "
        f"(engine {cpu.get('simulator', 0):.0f} us, client {cpu.get('client', 0):.0f} us) "
        f"-> {tp['gateway_rps_per_core']:.0f} req/s per fully busy core",
        "busy, share of one core (~100% = that process is the limit):",
        f"  requests/s  {_busy(tp['busy'])}",
        f"  streams     {_busy({t: st[t]['busy'] for t in ('direct', 'gateway')})}",
        f"gateway CPU per request at c=1: "
        f"{lat['non_stream']['gateway_cpu_us_per_request']:.0f} us (non-stream), "
        f"{lat['short_stream']['gateway_cpu_us_per_request']:.0f} us (short stream)",
        f"gateway CPU per relayed stream event: {st['gateway_cpu_us_per_event']:.1f} us",
        f"gateway RSS: {r['rss_mib']['gateway_start']:.1f} MiB at start, "
        f"{r['rss_mib']['gateway_end']:.1f} MiB after the runs",
        f"errors: {tp['errors']}; engine overlaps behind slots=1: {ho['engine_overlaps']}",
    ]
    if tp["first_error"]:
        lines.append(f"first error: {tp['first_error']}")
    return lines


def print_report(r: Result) -> None:
    m = r["machine"]
    print(f"\nslotgate overhead, {r['mode']} run, {r['date']}: {m['nproc']} CPUs "
          f"({m['cpu_model']}), Python {m['python']}, uvloop {m['uvloop'] or 'not installed'}, "
          f"gateway log level {r['gateway_log_level']}, load avg {m['loadavg'][0]:.2f}"
          f" -> {m['loadavg_end'][0]:.2f}, {r['elapsed_s']:.0f} s")
    for line in table(r):
        print(line)
    print("\ntargets (informative):")
    for t in r["targets"]:
        mark = "pass" if t["pass"] else "FAIL"
        print(f"  {mark}  {t['figure']:<40} {t['value']:>9.2f}  ({t['limit']})")
