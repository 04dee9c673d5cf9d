"""Objective-driven routing against queue-only and today's saturated fallback, on the load
test's mixed workload at 1.5x the primary's capacity.

Three arms, each its own embedded gateway and ledger, the same arrivals and prompts:

- queue_only: the 70B alone (no fallbacks; a full line answers 429);
- saturated: today's rules: simple requests that would wait go to the 8B, a full line
  overflows to the 8B, then to the 70B hosted serverless;
- objective: `fallback.when: objective` over the same fallbacks: the cheapest option that
  meets the class's TTFT objective (`policies/scheduler/objective.py`).

Callers: 20% critical, 60% standard, 20% sheddable (API keys of their class; sheddable asks
for it with `x-slotgate-priority`). The engines are the default config's, run ten times
faster (TTFT and decode), with the objectives, timeouts and GPU prices scaled alike, so
the figures are those of the default config in a tenth of the time. Per arm: the share of
requests that met their class's objective (a refused or failed request missed it), those
per primary GPU-hour, the cost per request and the p95 queue wait, with bootstrap 95% CIs.

    .venv/bin/python bench/objective_routing.py [--seconds 60] [--load 1.5] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from policies.clock.slo import Verdict, verdict
from router.app import start_gateway
from router.config import config_from_dict
from router.ledger.base import LedgerRow, RowFilter
from router.ledger.sqlite import SQLiteStore
from router.tools.loadtest import capacity
from router.tools.workload import Caller, LoadPlan, load_prompts, run_load

SCALE = 10  # the engines run this much faster than the default config's
GPU_HOUR, GPUS = 2.50 * SCALE, 4  # the 70B's price per (scaled) hour: the same per request
KEYS = {"critical": "sk-bench-critical", "standard": "sk-bench-standard"}
CALLERS = (Caller(0.2, KEYS["critical"]), Caller(0.6, KEYS["standard"]),
           Caller(0.2, KEYS["standard"], "sheddable"))
ARMS = ("queue_only", "saturated", "objective")


def engine(seqs: int, ttft_s: float, tokens_per_s: float) -> dict[str, Any]:
    return {"max_num_seqs": seqs, "ttft_s": ttft_s / SCALE,
            "tokens_per_s": tokens_per_s * SCALE, "output_tokens": 120,
            "output_tokens_spread": 0.5}


def config(arm: str, ledger: Path) -> dict[str, Any]:
    backends = {
        "llama-70b": {"simulated": engine(3, 0.4, 30), "model": "llama-3.1-70b", "slots": 3,
                      "queue_limit": 5, "queue_timeout_s": 60 / SCALE,
                      "price": {"gpu_hour": GPU_HOUR, "gpus": GPUS}},
        "llama-8b": {"simulated": engine(8, 0.1, 120), "model": "llama-3.1-8b", "slots": 8,
                     "queue_limit": 16, "queue_timeout_s": 30 / SCALE,
                     "price": {"input_per_mtok": 0.18, "output_per_mtok": 0.18}},
        "llama-70b-cloud": {"simulated": engine(16, 0.5, 40), "model": "llama-3.1-70b",
                            "slots": 16, "queue_limit": 16, "queue_timeout_s": 30 / SCALE,
                            "price": {"input_per_mtok": 0.88, "output_per_mtok": 0.88}},
    }
    route: dict[str, Any] = {"primary": "llama-70b"}
    if arm == "queue_only":
        route.update(fallbacks=[], overflow="reject", fallback={"when": "never"})
    else:
        route.update(fallbacks=["llama-8b", "llama-70b-cloud"], overflow="fallback",
                     fallback={"when": "saturated" if arm == "saturated" else "objective"})
    keys = [{"id": cls, "tenant": cls, "priority": cls,
             "sha256": hashlib.sha256(key.encode()).hexdigest()} for cls, key in KEYS.items()]
    slo = {cls: {"ttft_s": s / SCALE} for cls, s in
           (("critical", 2.0), ("standard", 5.0), ("sheddable", 20.0))}
    return {"backends": backends, "routes": {"chat": route}, "slo": slo,
            "auth": {"enabled": True, "keys": keys}, "ledger": {"path": str(ledger)}}


async def run_arm(arm: str, rate: float, seconds: float, seed: int,
                  folder: Path) -> list[LedgerRow]:
    path = folder / f"{arm}.sqlite3"
    gw = await start_gateway(config_from_dict(config(arm, path)), "127.0.0.1", 0)
    try:
        plan = LoadPlan("chat", rate, seconds, load_prompts(), seed=seed, callers=CALLERS,
                        drain_s=60.0)
        await run_load(gw.url, plan)
    finally:
        await gw.close()  # flushes the ledger
    store = SQLiteStore(str(path))
    await store.open()
    try:
        return await store.fetch(RowFilter())
    finally:
        await store.close()


def met(row: LedgerRow) -> bool:
    judged = verdict(row.slo_ttft_ms, row.ttft_ms, row.total_ms,
                     client_left=row.disconnect is not None)
    return judged is Verdict.ATTAINED


def interval(values: np.ndarray, stat: Any, rng: np.random.Generator,
             resamples: int = 2000) -> tuple[float, float, float]:
    """The statistic and its bootstrap 95% interval."""
    picks = rng.integers(0, len(values), size=(resamples, len(values)))
    spread = np.sort([stat(values[p]) for p in picks])
    return float(stat(values)), float(spread[int(0.025 * resamples)]), \
        float(spread[int(0.975 * resamples)])


def summarise(arm: str, rows: list[LedgerRow], seconds: float) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    hits = np.array([met(r) for r in rows], dtype=float)
    costs = np.array([r.cost for r in rows])
    waits = np.array([r.queue_wait_ms for r in rows])
    gpu_hours = seconds * SCALE / 3600 * GPUS  # the 70B's GPUs over the run, in real time
    share = interval(hits, np.mean, rng)
    by_class = {cls: float(np.mean([met(r) for r in rows if r.priority == cls] or [0]))
                for cls in ("critical", "standard", "sheddable")}
    return {"arm": arm, "n": len(rows), "met": share,
            "per_gpu_hour": tuple(v * len(rows) / gpu_hours for v in share),
            "cost": interval(costs, np.mean, rng),
            "p95_wait": interval(waits, lambda a: np.percentile(a, 95), rng),
            "classes": by_class,
            "where": {b: sum(r.backend == b and r.status == 200 for r in rows)
                      for b in ("llama-70b", "llama-8b", "llama-70b-cloud")},
            "refused": sum(r.status == 429 for r in rows)}


def show(results: list[dict[str, Any]]) -> None:
    def ci(v: tuple[float, float, float], fmt: str) -> str:
        return f"{v[0]:{fmt}} ({v[1]:{fmt}}-{v[2]:{fmt}})"

    print("| arm | requests | met objective | met per 70B GPU-hour | cost per request (USD) "
          "| p95 queue wait (ms) | critical / standard / sheddable met | 70B / 8B / cloud "
          "| 429 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        c, w = r["classes"], r["where"]
        print(f"| {r['arm']} | {r['n']} | {ci(r['met'], '.1%')} | "
              f"{ci(r['per_gpu_hour'], ',.0f')} | {ci(r['cost'], '.6f')} | "
              f"{ci(r['p95_wait'], ',.0f')} | {c['critical']:.0%} / {c['standard']:.0%} / "
              f"{c['sheddable']:.0%} | {w['llama-70b']} / {w['llama-8b']} / "
              f"{w['llama-70b-cloud']} | {r['refused']} |")
    at = {r["arm"]: r for r in results}
    if {"queue_only", "objective", "saturated"} <= set(at):
        gain = at["objective"]["per_gpu_hour"][0] / max(at["queue_only"]["per_gpu_hour"][0], 1e-9)
        cost = at["objective"]["cost"][0] / max(at["saturated"]["cost"][0], 1e-12)
        print(f"\nobjective / queue_only, met per GPU-hour: x{gain:.2f} (target >= x1.25)")
        print(f"objective / saturated, cost per request: x{cost:.2f} (target <= x1.00)")


async def main_async(args: argparse.Namespace) -> None:
    primary = config_from_dict(config("objective", Path("unused"))).backends["llama-70b"]
    cap = capacity(primary)
    assert cap is not None
    rate = cap * args.load
    print(f"70B capacity {cap:.2f} requests/s ({cap / SCALE:.2f} unscaled); {args.load:g}x = "
          f"{rate:.2f}/s for {args.seconds:g} s per arm", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for arm in args.arms:
            rows = await run_arm(arm, rate, args.seconds, args.seed, Path(folder))
            results.append(summarise(arm, rows, args.seconds))
            print(f"  {arm}: {len(rows)} requests, met {results[-1]['met'][0]:.1%}", flush=True)
    show(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--load", type=float, default=1.5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
