"""#32's targets: batch work in the slots interactive traffic leaves idle.

Two gateways on the embedded config.yaml (in this process, each with its own simulated
engines and ledger), given the same interactive Poisson traffic at 0.6x the 70B's
capacity at the same time; one of them also runs a 2,000-line batch (uploaded and created
with the official SDK: POST /v1/files, POST /v1/batches) on the same route. Then, on the
batch's gateway, probes that arrive while batch lines hold every slot, and on the other
the baselines: a slot hand-off between interactive requests, an engine's abort.

    .venv/bin/python bench/batch_share.py [--quick] [--auth] [--seed N]

~3 minutes (--quick: ~40 s). --auth runs both gateways with one API key (the default
config has none). Writes nothing; prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from batch_gateway import PRIMARY, BenchGateway, Engine70B, batch_input, default_raw, submit_batch
from batch_preempt import Probes, engine_aborts, hand_offs, probe_preemption
from batch_slots import (
    Row,
    SlotSeconds,
    Window,
    from_engine,
    from_ledger,
    ledger_rows,
    lines_ended,
    mean_hold,
    taken_while_waiting,
)
from batch_table import print_table
from batch_traffic import Stream, new_session, poisson, run_schedule

LOAD = 0.6  # of the 70B's capacity
BATCH_LINES = 2000
SETTLE_S = 2.0  # for the runner to fill the slots before the traffic starts


@dataclass(frozen=True)
class Scale:
    window_s: float
    probes: int
    hand_offs: int
    aborts: int


FULL = Scale(window_s=110.0, probes=40, hand_offs=60, aborts=15)
QUICK = Scale(window_s=20.0, probes=12, hand_offs=24, aborts=6)


@dataclass
class Results:
    """Everything the table shows, from one run."""

    scale: Scale
    engine: Engine70B
    rate: float  # interactive arrivals per second
    auth: bool
    alone: list[Stream]
    shared: list[Stream]
    hold_alone_s: float  # measured mean engine time of the interactive requests
    engine_slots: SlotSeconds  # on the batch's gateway, over the window
    ledger_slots: SlotSeconds
    # The gateways' queue waits (s) of interactive requests by id, from their ledgers
    waits_alone: dict[str, float]
    waits_shared: dict[str, float]
    taken_while_waiting: int  # batch lines that took a slot while an interactive one waited
    lines: tuple[int, int]  # batch lines answered and cut in the window
    preempted: int  # the batch gateway's count, whole run
    probes: Probes
    hand_offs: list[float]
    aborts: list[float]
    free_slot: list[float]  # arrival -> sequence start, interactive requests with a free slot


async def traffic(alone: BenchGateway, shared: BenchGateway, engine: Engine70B, rate: float,
                  scale: Scale, seed: int) -> tuple[list[Stream], list[Stream], Window]:
    """The same schedule on both gateways at once; the window it arrived in."""
    arrivals = poisson(rate, scale.window_s, seed, PRIMARY, engine.length)
    start = time.monotonic() + 0.2
    window = Window(start, start + scale.window_s, time.time() + 0.2)
    async with new_session() as a, new_session() as b:
        got = await asyncio.gather(run_schedule(a, alone.url, arrivals, start, alone.headers),
                                   run_schedule(b, shared.url, arrivals, start,
                                                shared.headers))
    return got[0], got[1], window


def free_slot_times(gw: BenchGateway, streams: list[Stream], waits: dict[str, float]
                    ) -> list[float]:
    """Arrival -> its sequence starts on the engine, for requests that waited for none."""
    out = []
    for s in streams:
        rec = gw.engine.records.get(s.request_id)
        if waits.get(s.request_id) == 0 and rec is not None and rec.first_token_at is not None \
                and rec.planned_ttft_s is not None:
            out.append(rec.first_token_at - rec.planned_ttft_s - s.sent_at)
    return out


async def run(scale: Scale, seed: int, auth: bool) -> Results:
    engine = Engine70B.of(default_raw())
    rate = LOAD * engine.capacity_per_s
    with tempfile.TemporaryDirectory(prefix="slotgate-batch-bench-") as tmp:
        folder = Path(tmp)
        alone = await BenchGateway.start(folder, "alone", auth)
        shared = await BenchGateway.start(folder, "batch", auth)
        try:
            await submit_batch(shared, batch_input(BATCH_LINES, engine, seed))
            await asyncio.sleep(SETTLE_S)
            streams_a, streams_b, window = await traffic(alone, shared, engine, rate, scale,
                                                         seed)
            slots = from_engine(shared.records(), window, engine.slots, time.monotonic())
            lines = lines_ended(shared.records(), window)
            async with new_session() as http:
                probes = await probe_preemption(http, shared, scale.probes, seed)
                gaps = await hand_offs(http, alone, scale.hand_offs, engine.slots + 2)
                aborts = await engine_aborts(http, alone, scale.aborts)
            preempted = shared.preempted()
            held = mean_hold(alone.records(), {s.request_id for s in streams_a})
        finally:
            await shared.close()
            await alone.close()
        rows = ledger_rows(shared.ledger, window, PRIMARY)
        waits = _waits(ledger_rows(alone.ledger, window, PRIMARY))
        return Results(scale, engine, rate, auth, streams_a, streams_b, held, slots,
                       from_ledger(rows, window, engine.slots), waits, _waits(rows),
                       taken_while_waiting(rows), lines, preempted, probes, gaps, aborts,
                       free_slot_times(alone, streams_a, waits))


def _waits(rows: list[Row]) -> dict[str, float]:
    return {r.request_id: r.queue_wait_s for r in rows if not r.batch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a ~40 s run")
    parser.add_argument("--auth", action="store_true", help="both gateways with one API key")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    logging.getLogger("slotgate").setLevel(logging.ERROR)
    results = asyncio.run(run(QUICK if args.quick else FULL, args.seed, args.auth))
    print_table(results)


if __name__ == "__main__":
    main()
