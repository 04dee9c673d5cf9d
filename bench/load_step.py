"""#34's bench: a load step, and an autoscaler following the gateway's desired replica count.

One gateway in this process, one backend of simulated replicas (8 slots each, a 1.0 s hold:
first token at 0.2 s, then 16 tokens at 20 per second), with `scaling` (floor 1, ceiling 6,
utilization 0.8, cool-down 30 s) and `fleet.refresh_s: 2`. Streamed Poisson arrivals at
0.3x one replica's capacity (8 requests/s), a step to 2x, and back down to 0.3x. The
autoscaler (bench/load_step_scaler.py) reads `GET /admin/scaling` every refresh and moves
the replica count to `desired`: a new replica is in service 5 s after it is asked for (a
pod starting), added to the config's `endpoints` and reloaded (`POST /admin/reload`); a
removed one runs out what it holds. Each second: the load, the count, the replicas in
service, the line, the time to first token of the second's arrivals.

    PYTHONPATH=. .venv/bin/python bench/load_step.py [--quick] [--seed N] [--png P] [--csv P]

~2 min 20 s (--quick: ~50 s, shorter phases and cool-down). Writes the CSV and the PNG
(docs/autoscaling-load-step.*) and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batch_traffic import Arrival, Stream, chat, new_session, run_schedule
from load_step_plot import Marks, Second, draw, write_csv
from load_step_scaler import Scaler
from load_step_table import Figures, figures, print_table, quantile

from router.app import RunningGateway, start_gateway
from router.config import config_from_dict
from router.console.pages import replica_counts

BACKEND = "llama"
SLOTS = 8
SIM = {"max_num_seqs": SLOTS, "ttft_s": 0.2, "tokens_per_s": 20.0, "output_tokens": 17}
HOLD_S = 0.2 + 16 / 20.0  # a request's slot time: its first token, then 16 more
CAPACITY = SLOTS / HOLD_S  # requests per second one replica serves
DOCS = Path(__file__).resolve().parent.parent / "docs"


@dataclass(frozen=True)
class Plan:
    low: float = 0.3  # x one replica's capacity
    high: float = 2.0
    warm_s: float = 20.0  # at low, then the step up
    up_s: float = 50.0  # at high, then the step down
    down_s: float = 60.0  # at low again
    refresh_s: float = 2.0
    cooldown_s: float = 30.0
    startup_s: float = 5.0
    utilization: float = 0.8
    ceiling: int = 6

    @property
    def total_s(self) -> float:
        return self.warm_s + self.up_s + self.down_s

    @property
    def down_at(self) -> float:
        return self.warm_s + self.up_s

    def load(self, t: float) -> float:
        return self.high if self.warm_s <= t < self.down_at else self.low

    @property
    def needed(self) -> int:
        """docs/autoscaling.md's formula at 2x, nothing waiting: rate x hold slots."""
        slots = self.high * CAPACITY * HOLD_S
        return math.ceil(slots / (SLOTS * self.utilization) - 1e-9)


QUICK = Plan(warm_s=8.0, up_s=20.0, down_s=20.0, cooldown_s=8.0)


def config(plan: Plan) -> dict[str, Any]:
    """The gateway's config; the autoscaler writes its backend's `endpoints`."""
    scaling = {"floor": 1, "ceiling": plan.ceiling, "utilization": plan.utilization,
               "cooldown_s": plan.cooldown_s}
    return {"server": {"max_connections_per_client": 4096},
            "fleet": {"refresh_s": plan.refresh_s},
            "backends": {BACKEND: {"model": "llama", "queue_limit": 2000,
                                   "initial_hold_s": HOLD_S, "pick": "least_loaded",
                                   "endpoints": [], "scaling": scaling}},
            "routes": {"chat": {"primary": BACKEND, "overflow": "reject"}}}


def arrivals(plan: Plan, seed: int) -> list[Arrival]:
    """Poisson arrivals whose rate follows the plan (drawn phase by phase)."""
    rng, at = random.Random(seed), 0.0
    out: list[Arrival] = []
    while True:
        at += rng.expovariate(plan.load(at) * CAPACITY)
        if at >= plan.total_s:
            return out
        body = chat("Summarise the attached notes in three bullet points.", 17, "chat")
        out.append(Arrival(at, f"ls-{len(out)}", body))


class Watch:
    """What the bench reads of the running gateway: each look's count (when it was made)
    and the longest line of each second."""

    def __init__(self, running: RunningGateway, start: float) -> None:
        self.start = start
        self.looks: list[tuple[float, int]] = []  # (seconds from the start, desired)
        self.peaks: dict[int, int] = {}
        fleet = running.gateway.fleet
        assert fleet is not None, "the backend has scaling"
        pool = running.gateway.backends[BACKEND].pool
        self._unwatch = pool.watch(lambda p: self._moved(p.queued))
        self._task = asyncio.create_task(self._follow(running))

    def _moved(self, queued: int) -> None:
        second = int(time.monotonic() - self.start)
        self.peaks[second] = max(self.peaks.get(second, 0), queued)

    async def _follow(self, running: RunningGateway) -> None:
        fleet = running.gateway.fleet
        assert fleet is not None
        while True:
            await fleet.looked.wait()
            self.looks.append((time.monotonic() - self.start, fleet.readings[BACKEND].desired))

    def close(self) -> None:
        self._unwatch()
        self._task.cancel()


async def sample(running: RunningGateway, scaler: Scaler, start: float, seconds: int
                 ) -> list[dict[str, int]]:
    """At the end of each second: the count, the replicas and the line."""
    pool = running.gateway.backends[BACKEND].pool
    out = []
    for k in range(1, seconds + 1):
        await asyncio.sleep(max(0.0, start + k - time.monotonic()))
        counts = replica_counts(running.gateway, BACKEND)
        out.append({"desired": counts.get("desired", 0), "ready": counts["ready"],
                    "draining": counts["draining"], "listed": len(scaler.listed),
                    "starting": len(scaler.starting), "queued": pool.queued})
    return out


@dataclass
class Run:
    plan: Plan
    arrivals: list[Arrival]
    streams: list[Stream]
    samples: list[dict[str, int]]
    watch: Watch
    scaler: Scaler
    start: float
    wall_s: float


async def run(plan: Plan, seed: int, folder: Path) -> Run:
    began = time.monotonic()
    raw, path = config(plan), folder / "config.yaml"
    scaler = Scaler("", path, raw, BACKEND, {"simulated": SIM, "slots": SLOTS},
                    plan.startup_s, plan.refresh_s)
    scaler.first(1)
    running = await start_gateway(config_from_dict(raw), "127.0.0.1", 0, config_path=str(path))
    scaler.url, schedule = running.url, arrivals(plan, seed)
    try:
        async with new_session() as http:
            start = time.monotonic() + 0.5
            watch = Watch(running, start)
            scaling = asyncio.create_task(scaler.run(http))
            sampler = asyncio.create_task(sample(running, scaler, start, int(plan.total_s)))
            streams = await run_schedule(http, running.url, schedule, start, {})
            samples = await sampler
            scaling.cancel()
            watch.close()
    finally:
        await running.close()
    return Run(plan, schedule, streams, samples, watch, scaler, start,
               time.monotonic() - began)


def seconds(r: Run) -> list[Second]:
    """The run, second by second."""
    arrived = [0] * len(r.samples)
    ttfts: list[list[float]] = [[] for _ in r.samples]
    for a in r.arrivals:
        arrived[min(int(a.at_s), len(arrived) - 1)] += 1
    for s in r.streams:
        k = int(s.sent_at - r.start)
        if 0 <= k < len(ttfts) and s.ttft_s is not None:
            ttfts[k].append(s.ttft_s)
    return [Second(k, r.plan.load(k), arrived[k] / CAPACITY, s["desired"], s["listed"],
                   s["starting"], s["ready"], s["draining"], s["queued"],
                   max(r.watch.peaks.get(k, 0), s["queued"]), quantile(ttfts[k], 0.95),
                   len(ttfts[k]))
            for k, s in enumerate(r.samples)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a ~45 s run, shorter phases")
    parser.add_argument("--png", type=Path, default=DOCS / "autoscaling-load-step.png")
    parser.add_argument("--csv", type=Path, default=DOCS / "autoscaling-load-step.csv")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("slotgate").setLevel(logging.ERROR)
    plan = QUICK if args.quick else Plan()
    with tempfile.TemporaryDirectory(prefix="slotgate-load-step-") as tmp:
        result = asyncio.run(run(plan, args.seed, Path(tmp)))
    rows = seconds(result)
    found: Figures = figures(result, rows, CAPACITY, HOLD_S, SLOTS)
    write_csv(args.csv, rows)
    draw(args.png, rows, Marks(plan.warm_s, plan.down_at, found.in_service_at),
         f"A load step: {plan.low}x -> {plan.high}x -> {plan.low}x of one replica's capacity "
         f"({SLOTS} slots, {HOLD_S:.1f} s hold)\nfleet.refresh_s {plan.refresh_s:g} s, "
         f"a replica's start-up {plan.startup_s:g} s, cool-down {plan.cooldown_s:g} s, "
         f"utilization {plan.utilization:g}")
    print_table(found)
    print(f"wrote {args.csv} and {args.png}")


if __name__ == "__main__":
    main()
