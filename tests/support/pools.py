"""The slot pools' contract tests' tools (tests/test_pool_contract*.py): a factory of local
or redis pools that checks their bounds, and waits on tickets and pool changes, each
within BOUND_S."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping, Sequence

import pytest

from policies.clock.answers import AnswerModel
from policies.clock.holds import HoldTimeModel
from policies.config import Priority, QueueOrder
from policies.health.breaker import CircuitBreaker
from policies.slots import Lease, LocalSlotPool, SlotPool, Ticket
from policies.slots.coordinator import RedisCoordinator
from policies.slots.redis import RedisSlotPool

BOUND_S = 5.0  # the longest any step may take; a pass takes milliseconds


class PoolFactory:
    """Builds the pools of one test, of one kind, and checks and closes them after it."""

    def __init__(self, redis_url: str | None, order: QueueOrder = QueueOrder.FIFO) -> None:
        self.redis_url = redis_url
        self.kind = "local" if redis_url is None else "redis"
        self.order = order  # within a class: FIFO, or fair between tenants
        self.prefix = "contract-" + os.urandom(6).hex()  # unique per test
        self.coordinators: list[RedisCoordinator] = []
        self.violations: list[str] = []
        self._made = 0
        self._before = asyncio.all_tasks()  # e.g. the redis-server fixture's own

    async def __call__(self, capacity: int, queue_limit: int, replicas: int = 1,
                       recheck_s: float = 1.0,
                       group: Mapping[str, int] | None = None,
                       answers: AnswerModel | None = None,
                       lease_ttl_s: float = 15) -> list[SlotPool]:
        """`replicas` views of one pool (gateway processes); `group`: its engine replicas'
        slots (a group of one of `capacity` by default); `answers`: the backend's answer
        model, which the forecasts read; `lease_ttl_s`: a shared lease's (renewed every
        third of it)."""
        self._made += 1
        name = f"pool{self._made}"
        if self.redis_url is None:
            local = LocalSlotPool(name, capacity, queue_limit, HoldTimeModel(1.0),
                                  replicas=group, answers=answers)
            local.order_by(self.order)
            self._check_bounds(local)
            return [local] * replicas
        pools: list[SlotPool] = []
        for _ in range(replicas):
            coordinator = RedisCoordinator(
                self.redis_url, prefix=self.prefix, call_timeout_s=0.5,
                breaker=CircuitBreaker(3, 5.0, time.monotonic))
            self.coordinators.append(coordinator)
            pool = RedisSlotPool(name, capacity, queue_limit, HoldTimeModel(1.0),
                                 coordinator, lease_ttl_s=lease_ttl_s, recheck_s=recheck_s,
                                 replicas=group, answers=answers, queue_order=self.order)
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
        """Record every reported state outside the pool's bounds (or a replica's slots);
        checked at teardown."""

        def seen(_: object) -> None:
            if not (0 <= pool.active <= pool.capacity and 0 <= pool.queued <= pool.queue_limit):
                self.violations.append(f"{pool.name}: active={pool.active} "
                                       f"queued={pool.queued}")
            self.violations += [f"{pool.name}: {seat}" for seat in pool.seats()
                                if not 0 <= seat.active <= seat.slots]

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
