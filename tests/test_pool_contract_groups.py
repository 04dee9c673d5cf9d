"""The slot pools' contract for a backend that is a group of engine replicas, each with its
own slots: local and redis pools alike grant on the preferred replica with a free seat,
hand a freed seat to the head of the line, and never put a replica above its slots (the
factory records any reported seat above its slots). With `replicas=2` the redis pools are
two gateway processes on one Redis pool; the local pool is one pool seen twice."""

from __future__ import annotations

from policies.slots import Lease, SlotPool
from tests.support.pools import (
    PoolFactory,
    enqueued,
    idle,
    next_granted,
    until,
    waiting,
)

GROUP = {"r0": 1, "r1": 2, "r2": 1}


def held(pool: SlotPool) -> dict[str, int]:
    return {seat.name: seat.active for seat in pool.seats()}


async def on(pool: SlotPool, *prefer: str) -> Lease:
    lease = await pool.try_acquire(prefer)
    assert lease is not None, f"no free seat: {held(pool)}"
    return lease


async def test_grants_go_to_the_preferred_replica_with_a_free_seat(
        pool_factory: PoolFactory) -> None:
    a, b = await pool_factory(capacity=4, queue_limit=4, replicas=2, group=GROUP)
    assert [(s.name, s.slots) for s in a.seats()] == list(GROUP.items())
    assert a.capacity == b.capacity == 4
    first, second = await on(a, "r1"), await on(b, "r1")
    third = await on(a, "r1")  # r1 is full: the others, in config order
    fourth = await on(b, "r0", "r2")  # r0 is full: the next preferred
    assert [lease.replica for lease in (first, second, third, fourth)] == [
        "r1", "r1", "r0", "r2"]
    assert await a.try_acquire(["r2"]) is None
    assert await b.try_acquire() is None
    await until(lambda: held(a) == held(b) == {"r0": 1, "r1": 2, "r2": 1}, a, b,
                what="every seat seen held")
    await second.release()
    fifth = await on(b, "r0", "r2")
    assert fifth.replica == "r1"  # the one free seat
    for lease in (first, third, fourth):
        await lease.release()
    await until(lambda: held(a) == held(b) == {"r0": 0, "r1": 1, "r2": 0}, a, b,
                what="releases seen")
    await fifth.release()
    await idle(pool_factory, a, b)


async def test_a_freed_seat_goes_to_the_head_of_the_line(pool_factory: PoolFactory) -> None:
    a, b = await pool_factory(capacity=4, queue_limit=4, replicas=2, group=GROUP)
    leases = {r: [await on(a, r) for _ in range(n)] for r, n in GROUP.items()}
    first, second, third = await enqueued(b), await enqueued(a), await enqueued(b)
    tasks = {await waiting(t): name for t, name in ((first, "1"), (second, "2"),
                                                    (third, "3"))}
    pending = set(tasks)
    order: list[tuple[str, str]] = []
    for replica in ("r1", "r2", "r1"):  # one seat frees at a time: the head takes it
        await leases[replica].pop().release()
        task = await next_granted(pending)
        lease = await task
        order.append((tasks[task], lease.replica))
        leases[replica].append(lease)
    assert order == [("1", "r1"), ("2", "r2"), ("3", "r1")]
    for held_here in leases.values():
        for lease in held_here:
            await lease.release()
    await idle(pool_factory, a, b)


async def test_an_unhealthy_replica_takes_nothing_new(pool_factory: PoolFactory) -> None:
    (pool,) = await pool_factory(capacity=4, queue_limit=4, group=GROUP)
    pool.set_healthy("r1", False)
    assert pool.capacity == 2
    assert [s.healthy for s in pool.seats()] == [True, False, True]
    leases = [await on(pool, "r1"), await on(pool, "r1")]
    assert [lease.replica for lease in leases] == ["r0", "r2"]
    assert await pool.try_acquire(["r1"]) is None
    ticket = await enqueued(pool)
    task = await waiting(ticket)
    pool.set_healthy("r1", True)  # back: its seats serve the line
    back = await (await next_granted({task}))
    assert back.replica == "r1"
    for lease in (*leases, back):
        await lease.release()
    await idle(pool_factory, pool)
