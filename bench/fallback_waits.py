"""Ten users, three slots: how long simple and hard requests wait, fallback on vs off.

Runs the `slotgate demo` scenario against two in-process gateways built from the embedded
config.yaml that differ only in `routes.llama-70b.fallback.when` (never vs saturated),
several rounds with the same prompt plans, and prints mean queue wait and time to first
token per kind of request. Usage: .venv/bin/python bench/fallback_waits.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

from policies.config import FallbackWhen
from router.app import start_gateway
from router.config import DEFAULT_CONFIG_PATH, parse_config
from router.tools.demo import DemoResult, plan_demo, run_demo


def config_with(when: str) -> Any:
    text = DEFAULT_CONFIG_PATH.read_text()
    config = parse_config(text, str(DEFAULT_CONFIG_PATH))
    route = config.routes["llama-70b"]
    fallback = route.fallback.model_copy(update={"when": FallbackWhen(when)})
    routes = {**config.routes, "llama-70b": route.model_copy(update={"fallback": fallback})}
    return config.model_copy(update={"routes": routes})


async def one_round(when: str, seed: int) -> DemoResult:
    running = await start_gateway(config_with(when), "127.0.0.1", 0)
    try:
        return await run_demo(running.url, plan_demo("llama-70b", 10, seed), max_tokens=60)
    finally:
        await running.close()


def summarise(results: list[DemoResult]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for kind in ("simple", "hard"):
        rows = [r for demo in results for r in demo.rows if r.kind == kind]
        waits = [(r.queue_wait_ms or 0.0) / 1000 for r in rows]
        ttfts = [r.ttft_s for r in rows if r.ttft_s is not None]
        small = sum(1 for r in rows if r.backend == "llama-8b")
        out[kind] = {"n": len(rows), "wait_s": statistics.fmean(waits),
                     "ttft_s": statistics.fmean(ttfts) if ttfts else float("nan"),
                     "on_small": small}
    return out


async def main(rounds: int) -> None:
    table: dict[str, dict[str, dict[str, float]]] = {}
    for when in ("never", "saturated"):
        results = [await one_round(when, seed) for seed in range(rounds)]
        table[when] = summarise(results)
    print(f"ten users, three slots on llama-70b, {rounds} rounds per setting (same plans)")
    print(f"{'fallback.when':<14}{'kind':<8}{'n':>4}{'mean wait s':>13}{'mean TTFT s':>13}"
          f"{'on llama-8b':>13}")
    for when, kinds in table.items():
        for kind, row in kinds.items():
            print(f"{when:<14}{kind:<8}{row['n']:>4.0f}{row['wait_s']:>13.2f}"
                  f"{row['ttft_s']:>13.2f}{row['on_small']:>13.0f}")
    for kind in ("simple", "hard"):
        off, on = table["never"][kind], table["saturated"][kind]
        ratio = on["ttft_s"] / off["ttft_s"] if off["ttft_s"] else float("nan")
        print(f"{kind}: mean TTFT with fallback on = x{ratio:.2f} of fallback off")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args().rounds))
