"""The cost of a grant: a release handing its slot to the next waiter, `queue_order: fifo`
against `fair`, on a local pool and on one shared through Redis, interleaved over rounds.

One slot; its holder releases it and the slot goes to the next of the waiters lined up
(round robin over the tenants, each request 100 prompt tokens and max_tokens 100), until
none is left.

- local: 500 waiters of 50 tenants; the time of the release, which grants synchronously.
- redis: 200 waiters of 20 tenants in one process, on a private redis-server; the time
  from the release until the next waiter holds the slot (the release's script, the
  wake-up and the grant's script).

    .venv/bin/python bench/grant_cost.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from redis_pool import start_redis, stop  # noqa: E402

from policies.clock.holds import HoldTimeModel  # noqa: E402
from policies.config import Priority, QueueOrder  # noqa: E402
from policies.health.breaker import CircuitBreaker  # noqa: E402
from policies.slots import Lease, LocalSlotPool, Share, Ticket  # noqa: E402
from policies.slots.coordinator import RedisCoordinator  # noqa: E402
from policies.slots.redis import RedisSlotPool  # noqa: E402

ORDERS = (QueueOrder.FIFO, QueueOrder.FAIR)


async def line_up(pool: Any, waiters: int, tenants: int) -> list[Ticket]:
    tickets = []
    for i in range(waiters):
        ticket = await pool.enqueue(Priority.STANDARD, None, 100,
                                    Share(f"tenant-{i % tenants}", 1.0, 100))
        assert ticket is not None
        tickets.append(ticket)
    return tickets


async def local_round(order: QueueOrder, waiters: int = 500, tenants: int = 50) -> list[float]:
    pool = LocalSlotPool("bench", 1, waiters, HoldTimeModel(1.0))
    pool.order_by(order)
    lease = pool.acquire_nowait()
    assert lease is not None
    tickets = await line_up(pool, waiters, tenants)
    waits = [asyncio.ensure_future(t.wait(60)) for t in tickets]
    await asyncio.sleep(0)  # every wait has begun
    out = []
    held: Lease = lease
    for _ in range(waiters):
        began = time.perf_counter()
        await held.release()  # hands the slot to the next waiter there and then
        out.append((time.perf_counter() - began) * 1e6)
        done, _ = await asyncio.wait([w for w in waits if not w.done()] or waits,
                                     return_when=asyncio.FIRST_COMPLETED)
        held = done.pop().result()
        waits = [w for w in waits if not w.done()]
    await held.release()
    return out


async def redis_round(url: str, order: QueueOrder, prefix: str, waiters: int = 200,
                      tenants: int = 20) -> list[float]:
    coordinator = RedisCoordinator(url, prefix, 0.5, CircuitBreaker(3, 5.0, time.monotonic))
    pool = RedisSlotPool("bench", 1, waiters, HoldTimeModel(1.0), coordinator, 15.0, 1.0,
                         queue_order=order)
    coordinator.start()
    out = []
    try:
        lease = await pool.try_acquire()
        assert lease is not None
        tickets = await line_up(pool, waiters, tenants)
        pending = {asyncio.ensure_future(t.wait(60)) for t in tickets}
        held: Lease = lease
        for _ in range(waiters):
            began = time.perf_counter()
            await held.release()
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            out.append((time.perf_counter() - began) * 1e6)
            held = done.pop().result()
            for extra in done:  # (one slot: never more than one at a time)
                await extra.result().release()
        await held.release()
    finally:
        await coordinator.close()
    return out


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    return (f"{statistics.median(ordered):,.1f} / "
            f"{ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]:,.1f}")


async def main_async(rounds: int, redis_url: str) -> None:
    local: dict[QueueOrder, list[float]] = {o: [] for o in ORDERS}
    shared: dict[QueueOrder, list[float]] = {o: [] for o in ORDERS}
    for r in range(rounds):
        for order in ORDERS:  # interleaved: the machine's noise falls on both alike
            local[order] += await local_round(order)
            shared[order] += await redis_round(redis_url, order, f"grant-{r}-{order}")
    print("| pool | fifo p50 / p99 (us) | fair p50 / p99 (us) | fair / fifo (p50) |")
    print("|---|---|---|---|")
    for name, figures in (("local, 500 waiters of 50 tenants", local),
                          ("redis, 200 waiters of 20 tenants", shared)):
        ratio = statistics.median(figures[QueueOrder.FAIR]) / statistics.median(
            figures[QueueOrder.FIFO])
        print(f"| {name} | {summary(figures[QueueOrder.FIFO])} | "
              f"{summary(figures[QueueOrder.FAIR])} | x{ratio:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    proc, url = start_redis()
    try:
        asyncio.run(main_async(args.rounds, url))
    finally:
        stop(proc)


if __name__ == "__main__":
    main()
