"""One contract for every slot pool: LocalSlotPool and RedisSlotPool pass the same tests.

A test asks `pool_factory` for pools of a capacity and a queue limit. With `replicas=2`
the redis pools are two replicas (two coordinators, one Redis pool); the local pool is
one pool seen twice, since one process has one. Nothing waits by sleeping: tests await
tickets, tasks and `next_change()`, each within a bound.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence

import pytest

from policies.breaker import CircuitBreaker
from policies.config import Priority
from policies.holds import HoldTimeModel
from policies.slots import Lease, LocalSlotPool, QueueShed, QueueTimeout, SlotPool, Ticket
from policies.slots.coordinator import RedisCoordinator
from policies.slots.redis import RedisSlotPool
from tests.support import RedisServer

BOUND_S = 5.0  # the longest any step may take; a pass takes milliseconds


class PoolFactory:
    """Builds the pools of one test, of one kind, and checks and closes them after it."""

    def __init__(self, redis_url: str | None) -> None:
        self.redis_url = redis_url
        self.kind = "local" if redis_url is None else "redis"
        self.prefix = "contract-" + os.urandom(6).hex()  # unique per test
        self.coordinators: list[RedisCoordinator] = []
        self.violations: list[str] = []
        self._made = 0
        self._before = asyncio.all_tasks()  # e.g. the redis-server fixture's own

    async def __call__(self, capacity: int, queue_limit: int, replicas: int = 1,
                       recheck_s: float = 1.0) -> list[SlotPool]:
        self._made += 1
        name = f"pool{self._made}"
        if self.redis_url is None:
            local = LocalSlotPool(name, capacity, queue_limit, HoldTimeModel(1.0))
            self._check_bounds(local)
            return [local] * replicas
        pools: list[SlotPool] = []
        for _ in range(replicas):
            coordinator = RedisCoordinator(
                self.redis_url, prefix=self.prefix, call_timeout_s=0.5,
                breaker=CircuitBreaker(3, 5.0, time.monotonic))
            self.coordinators.append(coordinator)
            pool = RedisSlotPool(name, capacity, queue_limit, HoldTimeModel(1.0),
                                 coordinator, lease_ttl_s=15, recheck_s=recheck_s)
            await self._start(coordinator, pool)
            self._check_bounds(pool)
            pools.append(pool)
        return pools

    async def _start(self, coordinator: RedisCoordinator, pool: RedisSlotPool) -> None:
        """Start the coordinator; return once it has subscribed to the pool's wake-ups
        (it wakes its pools right after subscribing, and a wake tells the watchers)."""
        subscribed = asyncio.get_running_loop().create_future()

        def woken(_: object) -> None:
            if not subscribed.done():
                subscribed.set_result(None)

        unwatch = pool.watch(woken)
        coordinator.start()
        try:
            async with asyncio.timeout(BOUND_S):
                await subscribed
                await coordinator.client.ping()  # a round trip: Redis has the SUBSCRIBE
        finally:
            unwatch()

    def _check_bounds(self, pool: SlotPool) -> None:
        """Record every reported state outside the pool's bounds; checked at teardown."""

        def seen(_: object) -> None:
            if not (0 <= pool.active <= pool.capacity and 0 <= pool.queued <= pool.queue_limit):
                self.violations.append(f"{pool.name}: active={pool.active} "
                                       f"queued={pool.queued}")

        pool.watch(seen)

    async def stored(self, pool: SlotPool) -> tuple[int, int] | None:
        """(holders, waiters) as Redis itself counts them; None for a local pool."""
        if not isinstance(pool, RedisSlotPool):
            return None
        client = pool.coordinator.client
        return int(await client.zcard(pool.keys[0])), int(await client.zcard(pool.keys[1]))

    async def close(self) -> None:
        for coordinator in self.coordinators:
            await coordinator.close()
        here = asyncio.current_task()
        stray = [t for t in asyncio.all_tasks() - self._before if t is not here]
        for task in stray:  # renewers or pollers of a test that failed half-way
            task.cancel()
        await asyncio.gather(*stray, return_exceptions=True)


@pytest.fixture(params=["local", "redis"])
def backend(request: pytest.FixtureRequest) -> str | None:
    """None for a local pool; the url of a private redis-server for a shared one."""
    if request.param == "local":
        return None
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


@pytest.fixture
async def pool_factory(backend: str | None) -> AsyncIterator[PoolFactory]:
    factory = PoolFactory(backend)
    try:
        yield factory
    finally:
        await factory.close()
    assert not factory.violations, f"states outside the bounds: {factory.violations}"


@pytest.fixture
async def redis_factory(redis_server: RedisServer) -> AsyncIterator[PoolFactory]:
    """Shared pools only: for what needs two replicas for real."""
    factory = PoolFactory(redis_server.url)
    try:
        yield factory
    finally:
        await factory.close()
    assert not factory.violations, f"states outside the bounds: {factory.violations}"


# -- helpers --------------------------------------------------------------------------------


def state(pools: Sequence[SlotPool]) -> list[tuple[int, int]]:
    return [(p.active, p.queued) for p in pools]


async def until(predicate: Callable[[], bool], *pools: SlotPool, what: str = "") -> None:
    """Wait for `predicate`, re-checking at each change of `pools` (redis pools learn of
    other changes by wake-ups), within BOUND_S."""
    try:
        async with asyncio.timeout(BOUND_S):
            while not predicate():
                changes = {p.next_change() for p in pools}
                await asyncio.wait(changes, return_when=asyncio.FIRST_COMPLETED)
    except TimeoutError:
        pytest.fail(f"not reached within {BOUND_S} s: {what}; (active, queued) = "
                    f"{state(pools)}")


async def idle(factory: PoolFactory, *pools: SlotPool) -> None:
    """Every pool reports nothing held and nobody queued; Redis agrees."""
    await until(lambda: all(s == (0, 0) for s in state(pools)), *pools, what="idle")
    for pool in pools:
        stored = await factory.stored(pool)
        assert stored in (None, (0, 0)), f"Redis still counts (holders, waiters) = {stored}"


async def acquired(pool: SlotPool) -> Lease:
    lease = await pool.try_acquire()
    assert lease is not None, f"no free slot: (active, queued) = {state([pool])}"
    return lease


async def enqueued(pool: SlotPool, priority: Priority = Priority.STANDARD) -> Ticket:
    ticket = await pool.enqueue(priority)
    assert ticket is not None, f"queue full: (active, queued) = {state([pool])}"
    return ticket


async def waiting(ticket: Ticket, timeout_s: float = BOUND_S) -> asyncio.Task[Lease]:
    """A task waiting on `ticket`, returned once it is inside `ticket.wait` (so that a
    cancellation reaches the wait, not a coroutine that never started)."""
    started = asyncio.get_running_loop().create_future()

    async def wait() -> Lease:
        started.set_result(None)
        return await ticket.wait(timeout_s)

    task = asyncio.create_task(wait())
    await started
    return task


async def next_granted(pending: set[asyncio.Task[Lease]]) -> asyncio.Task[Lease]:
    """The one waiter granted next (it fails if none is, or if several are at once)."""
    done, _ = await asyncio.wait(pending, timeout=BOUND_S, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1, f"{len(done)} waiters granted at once (expected exactly 1)"
    task = done.pop()
    pending.discard(task)
    return task


# -- the contract ---------------------------------------------------------------------------


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
