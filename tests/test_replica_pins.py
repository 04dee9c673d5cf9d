"""A waiter pinned to a replica (`enqueue(want=..., hold_s=...)`): the scheduler found that
waiting for the replica holding its prompt's prefix beats a cold prefill elsewhere. It
passes over slots freed on other replicas (those behind it take them) until its patience
ends, then takes any; a slot that no waiter takes stays free for a newcomer."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from policies.clock.answers import AnswerModel, Hints, Rates
from policies.clock.holds import HoldTimeModel
from policies.clock.lengths import uniform
from policies.slots import LocalLease, LocalSlotPool, QueueTimeout


def group(**replicas: int) -> LocalSlotPool:
    return LocalSlotPool("big", sum(replicas.values()), 100, HoldTimeModel(1.0),
                         replicas=replicas)


def fill(pool: LocalSlotPool, replica: str, n: int) -> list[LocalLease]:
    leases = [pool.acquire_nowait((replica,)) for _ in range(n)]
    assert all(lease is not None and lease.replica == replica for lease in leases)
    return leases  # type: ignore[return-value]


async def test_a_pinned_waiter_passes_other_replicas_slots_and_takes_its_own() -> None:
    pool = group(a=1, b=1)
    (on_a,), (on_b,) = fill(pool, "a", 1), fill(pool, "b", 1)
    pinned = pool.enqueue_nowait(want="a", hold_s=60.0)
    assert pinned is not None and pool.snapshot().pinned == 1
    on_b.release_now()  # b frees: nobody waiting takes it
    assert not pinned._future.done() and pool.snapshot().open
    newcomer = pool.acquire_nowait()  # so a newcomer may
    assert newcomer is not None and newcomer.replica == "b"
    on_a.release_now()
    assert (await pinned.wait(1.0)).replica == "a"
    assert pool.snapshot().pinned == 0 and pool.queued == 0


async def test_a_waiter_behind_a_pinned_one_takes_the_slot_it_passes() -> None:
    pool = group(a=1, b=1)
    (on_a,), (on_b,) = fill(pool, "a", 1), fill(pool, "b", 1)
    pinned = pool.enqueue_nowait(want="a", hold_s=60.0)
    behind = pool.enqueue_nowait()
    assert pinned is not None and behind is not None
    assert not pool.snapshot().open  # an unpinned waiter: a newcomer must queue
    on_b.release_now()
    assert (await behind.wait(1.0)).replica == "b" and pinned.position == 1
    on_a.release_now()
    assert (await pinned.wait(1.0)).replica == "a"


async def test_its_patience_over_a_pinned_waiter_takes_any_free_slot() -> None:
    pool = group(a=1, b=1)
    (on_a,), (on_b,) = fill(pool, "a", 1), fill(pool, "b", 1)
    pinned = pool.enqueue_nowait(want="a", hold_s=0.01)
    assert pinned is not None
    on_b.release_now()  # passed over while its patience lasts ...
    assert not pinned._future.done()
    lease = await pinned.wait(5.0)  # ... then the timer gives it the free slot
    assert lease.replica == "b" and pool.snapshot().pinned == 0
    on_a.release_now()
    lease.release_now()


async def test_a_waiter_pinned_to_a_replica_gone_sick_takes_any() -> None:
    pool = group(a=1, b=1)
    (_on_a,), (on_b,) = fill(pool, "a", 1), fill(pool, "b", 1)
    pinned = pool.enqueue_nowait(want="a", hold_s=60.0)
    assert pinned is not None
    on_b.release_now()
    pool.set_healthy("a", False)
    assert (await pinned.wait(1.0)).replica == "b"


async def test_a_pinned_waiter_that_leaves_is_no_longer_counted() -> None:
    pool = group(a=1, b=1)
    fill(pool, "a", 1), fill(pool, "b", 1)
    pinned = pool.enqueue_nowait(want="a", hold_s=60.0)
    assert pinned is not None
    with pytest.raises(QueueTimeout):
        await pinned.wait(0.0)
    assert pool.snapshot().pinned == 0 and pool.queued == 0
    assert pinned.pin is None  # its timer cancelled


async def test_a_fair_line_pins_no_one() -> None:
    from policies.config import QueueOrder
    pool = group(a=1, b=1)
    pool.order_by(QueueOrder.FAIR)
    fill(pool, "a", 1), fill(pool, "b", 1)
    ticket = pool.enqueue_nowait(want="a", hold_s=60.0)
    assert ticket is not None and ticket.pin is None and pool.snapshot().pinned == 0


async def test_the_replica_wait_counts_those_pinned_to_it_already() -> None:
    pool = group(a=2, b=2)
    fill(pool, "a", 2)
    alone = pool.replica_wait("a")
    assert 0 < alone < float("inf") and pool.replica_wait("b") == 0.0
    assert pool.enqueue_nowait(want="a", hold_s=60.0) is not None
    assert pool.enqueue_nowait(want="a", hold_s=60.0) is not None
    assert pool.replica_wait("a") > alone  # behind two: after a second round of holds
    pool.set_healthy("a", False)
    assert pool.replica_wait("a") == float("inf")


async def test_the_replica_wait_runs_at_the_replicas_own_rates_where_given() -> None:
    """A replica of the group on slower GPUs: its own rates (`Clock.rates_on`) in place of
    the pool's, the answers' lengths the pool's all the same (10 tokens)."""
    answers = AnswerModel(Hints(ttft_s=0.1, tokens_per_s=100.0, lengths=uniform(10, 0.0)))
    pool = LocalSlotPool("big", 2, 100, HoldTimeModel(1.0), clock=lambda: 0.0,
                         replicas={"a": 1, "b": 1}, answers=answers)
    fill(pool, "a", 1)  # just begun: its whole answer ahead
    assert pool.replica_wait("a") == pytest.approx(0.1 + 9 / 100)
    assert pool.replica_wait("a", Rates(1.0, 10.0)) == pytest.approx(1.0 + 9 / 10)
    assert pool.replica_wait("b", Rates(1.0, 10.0)) == 0.0  # free


@pytest.mark.parametrize("seed", range(20))
async def test_whatever_happens_no_slot_is_left_free_while_a_waiter_would_take_it(
    seed: int,
) -> None:
    """Pins and patience at random: no replica over its slots, the counts consistent,
    and a free slot only where every waiter is pinned elsewhere."""
    rng = random.Random(seed)
    slots = {"a": rng.randint(1, 3), "b": rng.randint(1, 3), "c": rng.randint(1, 3)}
    pool = group(**slots)
    leases: list[LocalLease] = []
    waiting: list[asyncio.Task[LocalLease]] = []
    tickets: list[Any] = []

    for step in range(300):
        roll = rng.random()
        if roll < 0.45:
            lease = pool.acquire_nowait(rng.sample(sorted(slots), rng.randint(0, 3)))
            if lease is not None:
                leases.append(lease)
            else:
                hold = rng.choice([0.0, 60.0, 60.0])
                ticket = pool.enqueue_nowait(want=rng.choice(sorted(slots)), hold_s=hold)
                assert ticket is not None
                tickets.append(ticket)
                waiting.append(asyncio.create_task(ticket.wait(60.0)))
        elif roll < 0.8 and leases:
            leases.pop(rng.randrange(len(leases))).release_now()
        elif roll < 0.9:
            pool.set_healthy(rng.choice(sorted(slots)), rng.random() < 0.6)
        elif tickets:
            pool._unpin(rng.choice(tickets))  # a patience ends
        await asyncio.sleep(0)  # let granted waiters run
        for task in [t for t in waiting if t.done()]:
            waiting.remove(task)
            leases.append(task.result())
        seats = pool.seats()
        assert all(seat.active <= seat.slots for seat in seats), (step, seats)
        assert sum(s.active for s in seats) == pool.active == len(leases)
        live = [t for t in tickets if not t._future.done()]
        assert pool.snapshot().pinned == sum(t.pin is not None for t in live)
        for seat in seats:
            if seat.healthy and seat.active < seat.slots:  # free: every waiter pinned away
                assert all(t.pin is not None and t.want != seat.name for t in live), step
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
