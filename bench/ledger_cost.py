"""What the ledger costs a request on the event loop, and how fast its stores write.

    .venv/bin/python bench/ledger_cost.py [--rounds N] [--postgres URL]

1. Per request, on the loop: `settle` (metrics, recent list) with the ledger off
   against the same with the ledger on (building the row, pricing it, appending it),
   interleaved A B A B over rounds. The writes themselves happen in batches elsewhere.
2. Store throughput: rows/s written in batches of 500 to SQLite (a file in a temp
   folder) and, when reachable, PostgreSQL (a fresh database), against the rate of
   building the same rows (the floor of any store).
3. SQLite at size: the writer's CPU per row once the table already holds `--at-size`
   rows (300,000: a day of a quiet gateway, minutes of a busy one), with random keys (the
   ids before #31) against the gateway's time-ordered ones (`new_id`), alternated.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from report import machine  # noqa: E402

from router.backend import open_backend  # noqa: E402
from router.common.record import RequestRecord, new_id  # noqa: E402
from router.config import config_from_dict  # noqa: E402
from router.gateway import Gateway  # noqa: E402
from router.ledger.base import Ledger, LedgerRow  # noqa: E402
from router.ledger.open import open_store  # noqa: E402
from router.request.accounting import settle  # noqa: E402
from router.request.usage import ledger_row  # noqa: E402

PER_ROUND = 20_000


def config(ledger: str | None) -> dict[str, Any]:
    sim = {"max_num_seqs": 3}
    raw: dict[str, Any] = {
        "backends": {
            "big": {"simulated": sim, "model": "m", "slots": 3,
                    "price": {"gpu_hour": 2.5, "gpus": 4}},
            "small": {"simulated": sim, "model": "s", "slots": 8,
                      "price": {"input_per_mtok": 0.18, "output_per_mtok": 0.18}},
        },
        "routes": {"chat": {"primary": "big", "fallbacks": ["small"]}},
    }
    if ledger is not None:
        raw["ledger"] = {"path": ledger}
    return raw


def records(n: int) -> list[RequestRecord]:
    out = []
    for i in range(n):
        rec = RequestRecord(f"req-{i}", "/v1/chat/completions", time.perf_counter(),
                            time.time(), os.urandom(12).hex(), route="chat", primary="big",
                            backend="big" if i % 3 else "small", reason="primary",
                            status=200, slot_at=1.0, slot_ms=850.0 + i % 100,
                            ttft_ms=120.0, prompt_tokens=40, completion_tokens=120 + i % 50)
        out.append(rec)
    return out


def time_record(gw: Gateway, recs: list[RequestRecord]) -> float:
    began = time.perf_counter()
    for rec in recs:
        settle(gw, rec, False)
    return (time.perf_counter() - began) / len(recs) * 1e6


async def per_request(rounds: int, folder: str) -> dict[str, Any]:
    plain = Gateway(config_from_dict(config(None)))
    on = Gateway(config_from_dict(config(str(Path(folder) / "unused.sqlite3"))))
    for gw in (plain, on):
        for name, backend in gw.config.backends.items():
            gw.backends[name] = await open_backend(name, backend, gw.config.coordination, None)
    off_us, on_us = [], []
    for _ in range(rounds):
        off_us.append(time_record(plain, records(PER_ROUND)))
        # rows beyond one batch are dropped: memory stays as flat as under a live writer
        on.ledger = Ledger(open_store(":memory:"), max_pending=500)
        on_us.append(time_record(on, records(PER_ROUND)))
    for gw in (plain, on):
        for opened in gw.backends.values():
            await opened.close()
    off, with_ledger = statistics.median(off_us), statistics.median(on_us)
    return {"record_ledger_off_us": off, "record_ledger_on_us": with_ledger,
            "added_us": with_ledger - off, "ratio": with_ledger / off}


async def store_rate(target: str, rows: list[LedgerRow]) -> float:
    store = open_store(target)
    await store.open()
    try:
        began = time.perf_counter()
        for i in range(0, len(rows), 500):
            await store.write(rows[i:i + 500])
        return len(rows) / (time.perf_counter() - began)
    finally:
        await store.close()


async def stores(folder: str, postgres: str | None) -> dict[str, Any]:
    gw = Gateway(config_from_dict(config(None)))
    began = time.perf_counter()
    rows = [ledger_row(rec, gw.config, None) for rec in records(50_000)]
    build = len(rows) / (time.perf_counter() - began)
    out: dict[str, Any] = {"build_rows_per_s": build,
                           "sqlite_rows_per_s": await store_rate(
                               str(Path(folder) / "bench.sqlite3"), rows)}
    if postgres:
        import asyncpg

        admin = await asyncpg.connect(postgres)
        name = "slotgate_bench_" + os.urandom(4).hex()
        await admin.execute(f"CREATE DATABASE {name}")
        try:
            out["postgres_rows_per_s"] = await store_rate(
                postgres.rpartition("/")[0] + "/" + name, rows)
        finally:
            await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
            await admin.close()
    return out


async def cpu_per_row_at_size(folder: str, size: int, keys: str) -> float:
    """The SQLite writer thread's CPU (us) per row for 20,000 rows added in batches of 500
    to a table of `size` rows, every row keyed `keys` (random, or time-ordered)."""
    key = (lambda: os.urandom(16).hex()) if keys == "random" else new_id
    gw = Gateway(config_from_dict(config(None)))
    template = ledger_row(records(1)[0], gw.config, None)
    store = open_store(str(Path(folder) / f"{keys}-{os.urandom(4).hex()}.sqlite3"))
    await store.open()
    try:
        async def add(n: int) -> None:
            for _ in range(n // 500):
                await store.write([template._replace(id=key(), ts=time.time())
                                   for _ in range(500)])
        await add(size)
        used = await store._call(time.thread_time)  # type: ignore[attr-defined]
        await add(20_000)
        return (await store._call(time.thread_time) - used) / 20_000 * 1e6  # type: ignore
    finally:
        await store.close()


async def main(rounds: int, postgres: str | None, at_size: int) -> None:
    print(machine())
    with tempfile.TemporaryDirectory() as folder:
        req = await per_request(rounds, folder)
        print(f"Gateway.record per request (median of {rounds} rounds x {PER_ROUND}):")
        print(f"  ledger off {req['record_ledger_off_us']:.2f} us   "
              f"ledger on {req['record_ledger_on_us']:.2f} us   "
              f"added {req['added_us']:.2f} us (x{req['ratio']:.2f})")
        rates = await stores(folder, postgres)
        at_size_us: dict[str, list[float]] = {"random": [], "time-ordered": []}
        for _ in range(2):
            for keys in at_size_us:
                at_size_us[keys].append(await cpu_per_row_at_size(folder, at_size, keys))
    print("Store writes, batches of 500 (50,000 rows):")
    build = rates["build_rows_per_s"]
    print(f"  building rows      {build:>10,.0f} rows/s (x1.00, the floor)")
    for key, label in (("sqlite_rows_per_s", "SQLite (WAL)"),
                       ("postgres_rows_per_s", "PostgreSQL")):
        if key in rates:
            print(f"  {label:<18} {rates[key]:>10,.0f} rows/s (x{rates[key] / build:.2f})")
    random_us, ordered_us = (statistics.median(v) for v in at_size_us.values())
    print(f"SQLite writer CPU per row, {at_size:,} rows already in the table (2 runs each):")
    print(f"  random keys        {random_us:>10.1f} us")
    print(f"  time-ordered keys  {ordered_us:>10.1f} us (x{ordered_us / random_us:.2f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres",
                        help="admin DSN; '' skips PostgreSQL")
    parser.add_argument("--at-size", type=int, default=300_000,
                        help="rows in the table before the at-size phase")
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.postgres or None, args.at_size))
