"""The suite's before side (`bench/suite.py --before REV`, `make bench BEFORE=REV`):
slotgate at an earlier revision as one more target of the rounds ("slotgate-before",
same config, same placement), the Python calls per request of both trees
(bench/call_paths.py), and the table of the hot-path issue's targets with before and after
side by side, each ratio taken within a round against the same aiohttp pass-through.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import free_port
from peer_configs import slotgate_yaml
from peers import BENCH, Fleet, Server
from suite_figures import _diff, _pairwise, _ratio, spread
from suite_tables import cell, num, ratio_cell, table

Result = dict[str, Any]
BEFORE = "slotgate-before"
CALL_REQUESTS = 200


def start_before(fleet: Fleet, tree: Path, mock: Server, key: str) -> Server:
    """slotgate served from `tree` (an earlier revision's worktree) by this interpreter."""
    port = free_port()
    config = slotgate_yaml(port, {"primary": mock.url, "small": mock.url},
                           ledger=fleet.dir / "before.sqlite3", key=key)
    boot = (f"import sys; sys.path.insert(0, {str(tree)!r}); import router; "
            f"assert router.__file__.startswith({str(tree)!r}), router.__file__; "
            "from router.cli import main; sys.exit(main())")
    return fleet.slotgate(BEFORE, config, port, key, command=[sys.executable, "-c", boot])


def call_counts(trees: dict[str, Path]) -> dict[str, Result]:
    """Python calls per request on the free, streamed and queued paths, per tree."""
    out: dict[str, Result] = {}
    for name, tree in trees.items():
        done = subprocess.run([sys.executable, str(BENCH / "call_paths.py"), "--tree",
                               str(tree), "--requests", str(CALL_REQUESTS), "--json"],
                              capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            out[name] = {"error": done.stderr[-500:]}
            continue
        out[name] = json.loads(done.stdout.strip().splitlines()[-1])["calls"]
    return out


def _ratio_to(result: Result, phase: str, key: str, side: str) -> Result | None:
    return spread(_pairwise(result, phase, key, side, "aiohttp", _ratio))


def _check(value: float | None, op: str, limit: float) -> str:
    if value is None:
        return "-"
    return "met" if (value <= limit if op == "<=" else value >= limit) else "**not met**"


def _median(s: Result | None) -> float | None:
    return s["median"] if s else None


def before_after_table(result: Result, rev: str) -> list[str]:
    """The hot-path issue's targets: before (REV) and after (this tree), same run."""
    rows: list[list[str]] = []
    sides = (BEFORE, "slotgate")
    for label, phase, key, op, limit in (
            ("server CPU per request c=64, / aiohttp", "throughput_c64",
             "cpu_us_per_request", "<=", 1.25),
            ("requests/s c=64, / aiohttp", "throughput_c64", "rps", ">=", 0.8),
            ("stream chunks/s c=16, / aiohttp", "stream_c16", "chunks_per_s", ">=", 1.1),
            ("server CPU per chunk, / aiohttp", "stream_c16", "cpu_us_per_chunk", "", 0)):
        got = [_ratio_to(result, phase, key, side) for side in sides]
        target = f"{op} x{limit:g}" if op else "-"
        rows.append([label, *(ratio_cell(s) for s in got), target,
                     _check(_median(got[1]), op, limit) if op else "-"])
    added = [spread(_pairwise(result, "latency_c1", "p50_ms", side, "aiohttp", _diff))
             for side in sides]
    rows.append(["added latency c=1 p50, minus aiohttp's (ms)",
                 *(cell(s, "ms", signed=True) for s in added), "<= +0.1",
                 _check(_median(added[1]), "<=", 0.1)])
    calls = result.get("calls") or {}
    for path, limit in (("free", 600.0), ("streamed", None), ("queued", None)):
        got_calls = [calls.get(side, {}).get(path) for side in sides]
        rows.append([f"Python calls per request, {path} path",
                     *(num(c) for c in got_calls), f"<= {limit:g}" if limit else "-",
                     _check(got_calls[1], "<=", limit) if limit else "-"])
    peak = result.get("peak_rss_mib", {})
    rows.append(["peak RSS (MiB)", num(peak.get(BEFORE)), num(peak.get("slotgate")),
                 "<= 100", _check(peak.get("slotgate"), "<=", 100)])
    queue = (result.get("saturation") or {}).get("queue_memory") or {}
    rows.append(["memory per queued request (KiB)", "-", num(queue.get("kib_per_request")),
                 "<= 20", _check(queue.get("kib_per_request"), "<=", 20)])
    return table(["figure", f"before ({rev})", "after (this tree)", "target", "met"], rows)
