"""One contract for every slot pool: LocalSlotPool and RedisSlotPool pass the same tests.
Here: grants, the order of the line (FIFO, classes, across replicas) and what the pools
report; how waiters leave the line: tests/test_pool_contract_leaving.py.

A test asks `pool_factory` for pools of a capacity and a queue limit. With `replicas=2`
the redis pools are two replicas (two coordinators, one Redis pool); the local pool is
one pool seen twice, since one process has one. Nothing waits by sleeping: tests await
tickets, tasks and `next_change()`, each within a bound.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from policies.clock.answers import AnswerModel, Hints
from policies.clock.forecast import Progress
from policies.config import Priority
from policies.slots import SlotPool
from policies.slots.redis import RedisSlotPool
from tests.support.pools import (
    BOUND_S,
    PoolFactory,
    acquired,
    enqueued,
    idle,
    next_granted,
    state,
    until,
    waiting,
)


async def test_capacity_then_none_and_release_is_idempotent(pool_factory: PoolFactory) -> None:
    a, b = await pool_factory(capacity=2, queue_limit=4, replicas=2)
    first, second = await acquired(a), await acquired(b)
    assert await a.try_acquire() is None
    assert await b.try_acquire() is None
    await first.release()
    await first.release()  # idempotent: it frees one slot, not two
    third = await acquired(b)
    assert await a.try_acquire() is None
    assert await b.try_acquire() is None
    assert b.snapshot().active == 2
    await second.release()
    await third.release()
    await third.release()
    await idle(pool_factory, a, b)


async def test_newcomers_never_overtake_a_waiter(pool_factory: PoolFactory) -> None:
    a, b = await pool_factory(capacity=1, queue_limit=4, replicas=2)
    lease = await acquired(a)
    ticket = await enqueued(a)
    await lease.release()  # the slot is the waiter's, granted or not yet
    assert await b.try_acquire() is None
    assert await a.try_acquire() is None
    mine = await ticket.wait(BOUND_S)
    assert await b.try_acquire() is None
    await mine.release()
    later = await acquired(b)  # nobody waits now: a newcomer gets the slot
    await later.release()
    await idle(pool_factory, a, b)


async def test_newcomers_never_overtake_even_with_a_slot_free(pool_factory: PoolFactory) -> None:
    a, b = await pool_factory(capacity=2, queue_limit=4, replicas=2)
    lease = await acquired(a)
    ticket = await enqueued(a)  # a slot is free, but the line is not empty
    assert await b.try_acquire() is None
    assert await a.try_acquire() is None
    await ticket.withdraw()
    await lease.release()
    await idle(pool_factory, a, b)


async def test_fifo_hand_off_and_positions(pool_factory: PoolFactory) -> None:
    (pool,) = await pool_factory(capacity=1, queue_limit=5)
    lease = await acquired(pool)
    t1, t2, t3 = [await enqueued(pool) for _ in range(3)]
    assert [t1.position, t2.position, t3.position] == [1, 2, 3]
    w3, w1, w2 = [await waiting(t) for t in (t3, t1, t2)]  # start order must not matter
    pending = {w1, w2, w3}

    await lease.release()
    assert await next_granted(pending) is w1
    await until(lambda: (t2.position, t3.position) == (1, 2), pool, what="t2, t3 move up")
    await (await w1).release()
    assert await next_granted(pending) is w2
    await until(lambda: t3.position == 1, pool, what="t3 is next")
    await (await w2).release()
    assert await next_granted(pending) is w3
    await (await w3).release()
    await idle(pool_factory, pool)


async def test_queue_limit(pool_factory: PoolFactory) -> None:
    a, b = await pool_factory(capacity=1, queue_limit=2, replicas=2)
    lease = await acquired(a)
    t1, t2 = await enqueued(a), await enqueued(b)
    assert await a.enqueue() is None
    assert await b.enqueue() is None
    assert a.snapshot().queue_room == 0
    await t1.withdraw()
    t3 = await enqueued(a)  # a withdrawal makes room
    assert t3.position == 2
    assert await b.enqueue() is None
    await t2.withdraw()
    await t3.withdraw()
    await lease.release()
    await idle(pool_factory, a, b)


async def test_snapshot_reflects_changes(pool_factory: PoolFactory) -> None:
    a, b = await pool_factory(capacity=2, queue_limit=3, replicas=2)

    def snap(pool: SlotPool) -> tuple[int, int, int, int]:
        s = pool.snapshot()
        return s.capacity, s.active, s.queued, s.queue_limit

    assert snap(a) == snap(b) == (2, 0, 0, 3)
    first = await acquired(a)
    assert snap(a) == (2, 1, 0, 3)
    second = await acquired(b)
    assert snap(b) == (2, 2, 0, 3)
    assert b.snapshot().free == 0
    ticket = await enqueued(b)
    assert snap(b) == (2, 2, 1, 3)
    assert b.snapshot().queue_room == 2
    await first.release()  # hands the slot to the waiter: still 2 held, nobody queued
    async with asyncio.timeout(BOUND_S):
        third = await ticket.wait(BOUND_S)
    await until(lambda: snap(a) == snap(b) == (2, 2, 0, 3), a, b, what="hand-off seen")
    await second.release()
    await until(lambda: snap(a) == snap(b) == (2, 1, 0, 3), a, b, what="release seen")
    await third.release()
    await until(lambda: snap(a) == snap(b) == (2, 0, 0, 3), a, b, what="all released")
    await idle(pool_factory, a, b)


@pytest.mark.parametrize("capacity", [1, 2])
async def test_global_fifo_across_replicas(redis_factory: PoolFactory, capacity: int) -> None:
    a, b = await redis_factory(capacity=capacity, queue_limit=4, replicas=2)
    held = [await acquired(a) for _ in range(capacity)]
    tickets = {}
    for name, pool in (("A1", a), ("B1", b), ("A2", a), ("B2", b)):
        tickets[name] = await enqueued(pool)
    assert [t.position for t in tickets.values()] == [1, 2, 3, 4]
    tasks = {name: await waiting(t) for name, t in tickets.items()}
    names = {task: name for name, task in tasks.items()}
    pending = set(tasks.values())
    order: list[str] = []
    while pending:
        await held.pop(0).release()  # one slot frees: exactly the head of the line gets it
        granted = await next_granted(pending)
        order.append(names[granted])
        held.append(await granted)
        stored = await redis_factory.stored(a)
        assert stored is not None and stored[0] == len(held) == capacity
    assert order == ["A1", "B1", "A2", "B2"]
    for lease in held:
        await lease.release()
    await idle(redis_factory, a, b)


async def test_newcomers_never_overtake_another_replicas_waiter(
        redis_factory: PoolFactory) -> None:
    """Even with a slot free: a waiter whose replica has not polled yet keeps its turn."""
    a, b = await redis_factory(capacity=2, queue_limit=4, replicas=2)
    assert isinstance(a, RedisSlotPool)
    lease = await acquired(a)
    slow = "ticket-of-a-replica-yet-to-poll"
    position, *_ = await a.coordinator.call(
        "enqueue", a.keys, [a.queue_limit, slow, a.ttl_ms, a.channel])
    assert position == 1
    assert await b.try_acquire() is None
    assert await a.try_acquire() is None
    done, *_ = await a.coordinator.call("withdraw", a.keys, [slow, a.channel])
    assert done == 1
    await lease.release()
    await idle(redis_factory, a, b)


async def test_wake_ups_alone_move_the_line(redis_factory: PoolFactory) -> None:
    """With the re-check far off, a withdrawal or a release on one replica reaches the
    waiters of every replica by its wake-up message."""
    a, b = await redis_factory(capacity=1, queue_limit=4, replicas=2, recheck_s=60.0)
    lease = await acquired(a)
    b1, a2, b3 = await enqueued(b), await enqueued(a), await enqueued(b)
    w2, w3 = await waiting(a2), await waiting(b3)
    await b1.withdraw()
    await until(lambda: (a2.position, b3.position) == (1, 2), a, b, what="moved up")
    await lease.release()
    async with asyncio.timeout(BOUND_S):
        second = await w2
    # (b3's position is not checked here: a grant elsewhere publishes `grant`, which does
    # not wake waiters, so b3 learns it moved up only at its next poll.)
    await second.release()
    async with asyncio.timeout(BOUND_S):
        third = await w3
    await third.release()
    await idle(redis_factory, a, b)


async def test_a_ticket_in_an_empty_line_gets_a_free_slot(pool_factory: PoolFactory) -> None:
    (pool,) = await pool_factory(capacity=1, queue_limit=4)
    ticket = await enqueued(pool)  # e.g. the admission saw a full pool, then a slot freed
    lease = await ticket.wait(1.0)
    assert state([pool]) == [(1, 0)]
    await lease.release()
    await idle(pool_factory, pool)


async def test_higher_classes_are_served_first_fifo_within_one(pool_factory: PoolFactory) -> None:
    a, b = await pool_factory(capacity=1, queue_limit=6, replicas=2)
    lease = await acquired(a)
    s1, x1 = await enqueued(a), await enqueued(b, Priority.SHEDDABLE)
    c1, s2 = await enqueued(b, Priority.CRITICAL), await enqueued(a)
    c2 = await enqueued(a, Priority.CRITICAL)
    order = [c1, c2, s1, s2, x1]
    await until(lambda: [t.position for t in order] == [1, 2, 3, 4, 5], a, b,
                what="positions by class, then arrival")
    tasks = {await waiting(t): t for t in order}
    pending = set(tasks)
    await lease.release()
    for expected in order:
        task = await next_granted(pending)
        assert tasks[task] is expected
        await (await task).release()
    await idle(pool_factory, a, b)


@dataclass
class Relayed:
    seen_events: int = 0  # a stream's relay counter, as router.common.usage.Usage holds it


async def test_the_forecast_sees_progress_held_here_and_others_ages(
        pool_factory: PoolFactory) -> None:
    answers = AnswerModel(Hints(0.0, 100.0))  # 100 tokens/s; an answer runs to its cap
    a, b = await pool_factory(capacity=2, queue_limit=4, replicas=2, answers=answers)
    far, near = await acquired(a), await acquired(b)
    far.follow(Progress(100, Relayed(0)))  # a second to go
    near.follow(Progress(100, Relayed(95)))  # 0.05 s to go, seen by b's process only
    ticket = await a.enqueue(max_tokens=50)
    assert ticket is not None
    if pool_factory.kind == "local":  # one process: both answers' progress
        assert ticket.eta_s() == pytest.approx(0.05, abs=0.03)
    else:  # a knows b's lease by its age alone (holding times: ~1 s), b its own progress
        assert ticket.eta_s() == pytest.approx(0.99, abs=0.05)
        assert b.forecast(1) == pytest.approx(0.05, abs=0.03)
    await near.release()
    granted = await ticket.wait(BOUND_S)
    await granted.release()
    await far.release()
    await idle(pool_factory, a, b)
