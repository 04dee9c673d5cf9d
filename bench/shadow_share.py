"""#33's bench: shadow comparisons cost interactive traffic nothing it can feel.

Pairs of gateways on the embedded config.yaml (in this process, each with its own
simulated engines and ledger): in each pair one has `routes.llama-70b.quality.shadow_rate:
1.0` (every request the route moves to the 8B is replayed on the 70B and judged there, in
slots nobody waits for), the other 0, and both are given the same interactive Poisson
streams at 0.8x the 70B's capacity at once: a third of them the demo's simple prompts
(moved to the 8B while the 70B is saturated), the rest its hard ones. Each pair has
arrivals of its own (seed, seed + 1, ...); the figures pool the pairs. Interactive time to
first token side by side, then what the shadows did and what they held of the 70B.

    .venv/bin/python bench/shadow_share.py [--quick] [--seed N] [--pairs N]

~3 minutes (--quick: ~40 s). Writes nothing; prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batch_gateway import PRIMARY, BenchGateway, Engine70B, default_raw
from batch_slots import Window, from_engine, from_ledger, ledger_rows
from batch_slots import taken_while_waiting as shadow_took_slot
from batch_traffic import Arrival, Stream, new_session, poisson, run_schedule
from shadow_clock import Holds, sample
from shadow_figures import (
    Measured,
    drain,
    is_shadow,
    moved,
    preemptors,
    scrape,
    shadow_calls,
    verdicts_kept,
    waited_beside_shadow,
)
from shadow_table import HAND_OFF_S, print_table

from router.quality.shadows import ShadowRunner
from router.tools.demo import HARD, SIMPLE

LOAD = 0.8  # of the 70B's capacity
PROMPTS = SIMPLE + HARD * 2  # a third simple
SHADOW_RATE = 1.0
Traffic = tuple[list[Stream], list[Stream], tuple[Holds, Holds]]  # shadows off, on


@dataclass(frozen=True)
class Scale:
    window_s: float
    drain_s: float  # the most the bench waits for the shadows left after the traffic


FULL = Scale(window_s=130.0, drain_s=40.0)
QUICK = Scale(window_s=24.0, drain_s=8.0)


@dataclass
class Results:
    """Everything the table shows, from one run: each pair's figures."""

    scale: Scale
    engine: Engine70B
    rate: float  # interactive arrivals per second, each pair
    pairs: list[Measured]
    drained_s: float  # the runners were idle this long after the traffic (<= drain_s)


def with_shadow_rate(rate: float) -> Callable[[dict[str, Any]], None]:
    def edit(raw: dict[str, Any]) -> None:
        raw["routes"][PRIMARY].setdefault("quality", {})["shadow_rate"] = rate
    return edit


@dataclass
class Pair:
    """Two gateways, shadows off and on, and the arrivals both are given."""

    off: BenchGateway
    on: BenchGateway
    arrivals: list[Arrival]

    @classmethod
    async def start(cls, folder: Path, n: int, arrivals: list[Arrival]) -> Pair:
        off = await BenchGateway.start(folder, f"off-{n}", False, with_shadow_rate(0.0))
        on = await BenchGateway.start(folder, f"on-{n}", False, with_shadow_rate(SHADOW_RATE))
        assert off.running.gateway.shadows is None
        return cls(off, on, arrivals)

    @property
    def runner(self) -> ShadowRunner:
        runner = self.on.running.gateway.shadows
        assert runner is not None
        return runner

    async def traffic(self, start: float, end: float) -> Traffic:
        """The arrivals to both at once, their clocks sampled until `end`."""
        async with new_session() as a, new_session() as b:
            off, on, holds = await asyncio.gather(
                run_schedule(a, self.off.url, self.arrivals, start, self.off.headers),
                run_schedule(b, self.on.url, self.arrivals, start, self.on.headers),
                sample(self.off, self.on, end))
        return off, on, holds

    async def close(self) -> None:
        await self.on.close()
        await self.off.close()


def arrivals(n: int, rate: float, scale: Scale, seed: int, engine: Engine70B
             ) -> list[Arrival]:
    """Pair n's schedule: its own seed, its request ids its own (`ia-<n>-<i>`)."""
    return [Arrival(a.at_s, f"ia-{n}-{a.request_id[3:]}", a.body) for a in
            poisson(rate, scale.window_s, seed + n, PRIMARY, engine.length, PROMPTS)]


async def measure(pair: Pair, traffic: Traffic, window: Window, engine: Engine70B
                  ) -> Measured:
    """What the pair's shadow gateway did (its engine and /metrics: while it runs)."""
    async with new_session() as http:
        counts = await scrape(http, pair.on.url)
    records = pair.on.records()
    simple = sum(a.body["messages"][0]["content"] in SIMPLE for a in pair.arrivals)
    return Measured(traffic[0], traffic[1], traffic[2], simple, counts,
                    from_engine(records, window, engine.slots, time.monotonic(), is_shadow),
                    shadow_calls(records), pair.on.preempted(), preemptors(records, HAND_OFF_S))


def read_ledgers(m: Measured, pair: Pair, window: Window, slots: int) -> None:
    """The figures of the pair's ledgers (once its gateways have closed: all written)."""
    rows = ledger_rows(pair.on.ledger, window, PRIMARY)
    m.moved = (moved(pair.off.ledger, window), moved(pair.on.ledger, window))
    m.verdicts_kept = verdicts_kept(pair.on.ledger)
    m.ledger_slots = from_ledger(rows, window, slots)
    m.shadow_rows = sum(r.batch for r in rows)
    m.took_slot_while_waiting = shadow_took_slot(rows)
    m.waited_beside_shadow = waited_beside_shadow(rows, HAND_OFF_S)


async def run(scale: Scale, seed: int, count: int) -> Results:
    engine = Engine70B.of(default_raw())
    rate = LOAD * engine.capacity_per_s
    with tempfile.TemporaryDirectory(prefix="slotgate-shadow-bench-") as tmp:
        pairs: list[Pair] = []
        try:
            for n in range(count):
                pairs.append(await Pair.start(Path(tmp), n, arrivals(n, rate, scale, seed,
                                                                     engine)))
            start = time.monotonic() + 0.2
            window = Window(start, start + scale.window_s, time.time() + 0.2)
            streams = await asyncio.gather(*(p.traffic(start, window.end) for p in pairs))
            drained = max(await asyncio.gather(*(drain(p.runner, scale.drain_s)
                                                 for p in pairs)))
            measured = [await measure(p, s, window, engine)
                        for p, s in zip(pairs, streams, strict=True)]
        finally:
            for pair in pairs:
                await pair.close()
        for m, pair in zip(measured, pairs, strict=True):
            read_ledgers(m, pair, window, engine.slots)
        return Results(scale, engine, rate, measured, drained)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a ~40 s run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=4, help="pairs of gateways at once")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("slotgate").setLevel(logging.ERROR)
    results = asyncio.run(run(QUICK if args.quick else FULL, args.seed, args.pairs))
    print_table(results)


if __name__ == "__main__":
    main()
