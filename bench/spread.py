"""The spread of the headline figures over several `overhead.py --json` files.

    .venv/bin/python bench/spread.py run1.json run2.json run3.json
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

FIGURES = (  # label, key path into the result
    ("direct p50 ms (c=1)", ("latency", "non_stream", "direct_ms", "p50")),
    ("gateway p50 ms (c=1)", ("latency", "non_stream", "gateway_ms", "p50")),
    ("added p50 ms (c=1)", ("latency", "non_stream", "added_ms", "p50")),
    ("added p99 ms (c=1)", ("latency", "non_stream", "added_ms", "p99")),
    ("short stream added p50 ms", ("latency", "short_stream", "added_ms", "p50")),
    ("short stream added p99 ms", ("latency", "short_stream", "added_ms", "p99")),
    ("direct req/s (c=64)", ("throughput", "direct_rps")),
    ("gateway req/s (c=64)", ("throughput", "gateway_rps")),
    ("gateway / direct req/s", ("throughput", "ratio")),
    ("gateway CPU us/request c=1", ("latency", "non_stream", "gateway_cpu_us_per_request")),
    ("gateway CPU us/request c=64", ("throughput", "cpu_us_per_request", "gateway", "gateway")),
    ("gateway req/s per busy core", ("throughput", "gateway_rps_per_core")),
    ("direct stream events/s", ("stream_relay", "direct", "events_per_s")),
    ("gateway stream events/s", ("stream_relay", "gateway", "events_per_s")),
    ("gateway / direct events/s", ("stream_relay", "ratio")),
    ("direct hand-off p50 ms", ("handoff", "direct_ms", "p50")),
    ("direct hand-off p99 ms", ("handoff", "direct_ms", "p99")),
    ("gateway hand-off p50 ms", ("handoff", "gateway_ms", "p50")),
    ("gateway hand-off p99 ms", ("handoff", "gateway_ms", "p99")),
    ("gateway RSS MiB after", ("rss_mib", "gateway_end")),
)


def lookup(result: Any, path: Sequence[str]) -> float:
    for key in path:
        result = result[key]
    return float(result)


def _fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3f}"


def main(paths: Sequence[str]) -> int:
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    results = [orjson.loads(Path(p).read_bytes()) for p in paths]
    print(f"{'figure':<30}{'min':>10}{'median':>10}{'max':>10}   ({len(results)} runs)")
    for label, path in FIGURES:
        values = [lookup(r, path) for r in results]
        cells = (min(values), statistics.median(values), max(values))
        print(f"{label:<30}" + "".join(f"{_fmt(v):>10}" for v in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
