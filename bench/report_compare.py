"""What the cost report's A/B comparison costs on 10,000 ledger rows.

    .venv/bin/python bench/report_compare.py [--rounds 5]

`compare` (bootstrap intervals for the cost per request, the saving and the p95 queue
wait, 2,000 resamples) on two arms of 5,000 rows each, against the baseline of reading the
same rows' costs into arrays and taking their means (what any report does at least).
Interleaved rounds; medians and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from router.ledger.base import LedgerRow
from router.report.build import compare


def rows(arm: str, costs: list[float], waits: list[float]) -> list[LedgerRow]:
    return [LedgerRow(id=f"{arm}{i}", ts=0.0, request_id=f"{arm}{i}",
                      endpoint="/v1/chat/completions",
                      route="chat", primary="big", experiment="e", arm=arm, tenant=None,
                      backend="big", reason="primary", intent=None, p_simple=None,
                      stream=False, status=200, error=None, disconnect=None,
                      queue_wait_ms=w, ttft_ms=None, total_ms=w, slot_ms=0.0,
                      prompt_tokens=1, completion_tokens=1, tokens_estimated=False,
                      cost=c, counterfactual_cost=c, key_id=None)
            for i, (c, w) in enumerate(zip(costs, waits, strict=True))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    costs, waits = rng.random(10_000).tolist(), rng.exponential(300, 10_000).tolist()
    a, b = rows("a", costs[:5000], waits[:5000]), rows("b", costs[5000:], waits[5000:])
    base_s, compare_s = [], []
    for _ in range(args.rounds):
        began = time.perf_counter()
        _ = (np.array([r.cost for r in a]).mean(), np.array([r.cost for r in b]).mean())
        base_s.append(time.perf_counter() - began)
        began = time.perf_counter()
        compare(a, b, arm="a", baseline="b", resamples=2000, seed=0)
        compare_s.append(time.perf_counter() - began)
    base, full = statistics.median(base_s), statistics.median(compare_s)
    print(f"means only   {base * 1000:8.2f} ms  (rounds {min(base_s) * 1000:.2f}-"
          f"{max(base_s) * 1000:.2f})")
    print(f"compare      {full * 1000:8.2f} ms  (rounds {min(compare_s) * 1000:.2f}-"
          f"{max(compare_s) * 1000:.2f})")
    print(f"ratio        x{full / base:.1f}")


if __name__ == "__main__":
    main()
