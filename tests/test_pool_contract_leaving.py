"""The slot pools' contract, how a waiter leaves the line: its wait times out, it is
cancelled (also racing the hand-off), it withdraws after a grant, or a full queue sheds it.
Every pool passes (tests/test_pool_contract.py has the grants and the order of the line).
Nothing waits by sleeping: tests await tickets, tasks and `next_change()`, within a bound."""

from __future__ import annotations

import asyncio

import pytest

from policies.config import Priority
from policies.slots import QueueShed, QueueTimeout
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


async def test_wait_timeout_raises_and_leaves_the_line(pool_factory: PoolFactory) -> None:
    (pool,) = await pool_factory(capacity=1, queue_limit=4)
    lease = await acquired(pool)
    ticket = await enqueued(pool)
    assert pool.queued == 1
    with pytest.raises(QueueTimeout):
        await ticket.wait(0.05)
    assert pool.queued == 0
    assert await pool_factory.stored(pool) in (None, (1, 0))
    behind = await enqueued(pool)
    assert behind.position == 1  # the timed-out ticket is not ahead any more
    await behind.withdraw()
    await lease.release()  # ... and it is not handed the slot either
    await idle(pool_factory, pool)


async def test_cancelled_waiter_leaves_the_line(pool_factory: PoolFactory) -> None:
    a, b = await pool_factory(capacity=1, queue_limit=4, replicas=2)
    lease = await acquired(a)
    t1, t2 = await enqueued(a), await enqueued(b)
    w1, w2 = await waiting(t1), await waiting(t2)
    w1.cancel()
    with pytest.raises(asyncio.CancelledError):
        await w1
    await until(lambda: a.queued == 1 and b.queued == 1 and t2.position == 1, a, b,
                what="the cancelled ticket is out of line")
    await lease.release()
    async with asyncio.timeout(BOUND_S):
        second = await w2  # the slot goes to the ticket behind the cancelled one
    await until(lambda: state([a, b]) == [(1, 0), (1, 0)], a, b, what="one holder, no line")
    await second.release()
    await idle(pool_factory, a, b)


@pytest.mark.parametrize("order", ["cancel_then_release", "release_then_cancel"])
async def test_cancellation_racing_the_hand_off_leaks_nothing(
        pool_factory: PoolFactory, order: str) -> None:
    a, b = await pool_factory(capacity=1, queue_limit=4, replicas=2)
    lease = await acquired(a)
    t1, t2 = await enqueued(a), await enqueued(b)
    w1, w2 = await waiting(t1), await waiting(t2)
    if order == "cancel_then_release":  # the withdrawal is still on its way
        w1.cancel()
        await lease.release()
    else:  # the slot may be on its way to t1
        await lease.release()
        w1.cancel()
    with pytest.raises(asyncio.CancelledError):
        await w1
    async with asyncio.timeout(BOUND_S):
        second = await w2
    await until(lambda: state([a, b]) == [(1, 0), (1, 0)], a, b, what="one holder, no line")
    assert await pool_factory.stored(a) in (None, (1, 0))
    await second.release()
    await idle(pool_factory, a, b)


async def test_withdraw_after_grant_passes_the_slot_on(pool_factory: PoolFactory) -> None:
    (pool,) = await pool_factory(capacity=1, queue_limit=4)
    lease = await acquired(pool)
    t1, t2 = await enqueued(pool), await enqueued(pool)
    await lease.release()
    await until(lambda: state([pool]) == [(1, 1)] and t2.position == 1, pool,
                what="t1 granted")
    await t1.withdraw()  # granted but never claimed: the slot goes to t2
    await t1.withdraw()  # idempotent: it does not give anything back twice
    second = await t2.wait(BOUND_S)
    assert await pool_factory.stored(pool) in (None, (1, 0))
    assert state([pool]) == [(1, 0)]
    await second.release()
    await idle(pool_factory, pool)


async def test_a_full_queue_sheds_its_newest_sheddable_waiter(pool_factory: PoolFactory) -> None:
    a, b = await pool_factory(capacity=1, queue_limit=3, replicas=2)
    lease = await acquired(a)
    x1, x2 = await enqueued(a, Priority.SHEDDABLE), await enqueued(b, Priority.SHEDDABLE)
    s1 = await enqueued(a)
    w1, w2, w_s1 = await waiting(x1), await waiting(x2), await waiting(s1)
    assert a.snapshot().room_for(Priority.SHEDDABLE) == 0
    assert await b.enqueue(Priority.SHEDDABLE) is None  # nobody to displace for its class
    await until(lambda: b.snapshot().sheddable == 2, a, b, what="two sheddable seen")
    assert b.snapshot().room_for(Priority.CRITICAL) == 2
    c1 = await enqueued(b, Priority.CRITICAL)  # takes the place of x2, the newest
    with pytest.raises(QueueShed):
        await asyncio.wait_for(w2, BOUND_S)
    s2 = await enqueued(a)  # takes the place of x1
    with pytest.raises(QueueShed):
        await asyncio.wait_for(w1, BOUND_S)
    assert await b.enqueue(Priority.CRITICAL) is None  # full, and nobody left to shed
    await until(lambda: [c1.position, s1.position, s2.position] == [1, 2, 3], a, b,
                what="the survivors' places")
    w_c1, w_s2 = await waiting(c1), await waiting(s2)
    pending = {w_c1, w_s1, w_s2}
    await lease.release()
    for expected in (w_c1, w_s1, w_s2):
        assert await next_granted(pending) is expected
        await (await expected).release()
    await idle(pool_factory, a, b)
