"""A local pool over a group of replicas: one line, each replica within its own slots, a
freed slot handed to the head of the line on the replica that freed it, unhealthy and
removed replicas out of the capacity. And a shared pool's group while Redis is away."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from policies.clock.holds import HoldTimeModel
from policies.health.breaker import CircuitBreaker
from policies.slots import LocalLease, LocalSlotPool, Seats
from policies.slots.coordinator import RedisCoordinator
from policies.slots.failover import FailoverPool
from router.config import config_from_dict
from router.upstream.pools import make_pool
from tests.support import closed_port


def group(**replicas: int) -> LocalSlotPool:
    return LocalSlotPool("big", sum(replicas.values()), 100, HoldTimeModel(1.0),
                         replicas=replicas)


def held(pool: LocalSlotPool) -> dict[str, int]:
    return {s.name: s.active for s in pool.seats()}


async def test_a_slot_goes_to_the_preferred_replica_else_the_first_free_one() -> None:
    pool = group(a=2, b=2, c=2)
    leases = [pool.acquire_nowait(("c",)) for _ in range(3)]
    assert [lease.replica for lease in leases if lease] == ["c", "c", "a"]
    assert held(pool) == {"a": 1, "b": 0, "c": 2}
    more = [pool.acquire_nowait(("c", "b")) for _ in range(3)]
    assert [lease.replica for lease in more if lease] == ["b", "b", "a"]
    assert pool.acquire_nowait() is None and pool.snapshot().free == 0
    assert pool.seats() == (Seats("a", 2, 2), Seats("b", 2, 2), Seats("c", 2, 2))


async def test_a_freed_slot_goes_to_the_head_of_the_line_on_its_replica() -> None:
    pool = group(a=1, b=1)
    first, second = pool.acquire_nowait(), pool.acquire_nowait()
    assert first is not None and second is not None
    tickets = [pool.enqueue_nowait() for _ in range(3)]
    assert all(t is not None for t in tickets) and pool.queued == 3
    second.release_now()
    head = await tickets[0].wait(1.0)  # type: ignore[union-attr]
    assert head.replica == "b" and pool.queued == 2
    assert pool.acquire_nowait(("b",)) is None  # a newcomer never overtakes the line
    first.release_now()
    assert (await tickets[1].wait(1.0)).replica == "a"  # type: ignore[union-attr]


async def test_an_unhealthy_replica_leaves_the_capacity_and_serves_the_line_when_back() -> None:
    pool = group(a=1, b=1)
    on_a = pool.acquire_nowait(("a",))
    assert on_a is not None and on_a.replica == "a"
    pool.set_healthy("b", False)
    assert pool.capacity == 1 and pool.snapshot().free == 0
    assert pool.acquire_nowait(("b",)) is None
    ticket = pool.enqueue_nowait()
    assert ticket is not None
    pool.set_healthy("b", True)  # back: its free slot goes to the waiter at once
    assert (await ticket.wait(1.0)).replica == "b"
    assert pool.capacity == 2


async def test_a_replica_running_while_unhealthy_frees_nothing_for_the_line() -> None:
    pool = group(a=1, b=1)
    on_a, on_b = pool.acquire_nowait(("a",)), pool.acquire_nowait(("b",))
    assert on_a is not None and on_b is not None
    ticket = pool.enqueue_nowait()
    assert ticket is not None
    pool.set_healthy("a", False)
    on_a.release_now()  # a's slot is outside the capacity now: the waiter keeps waiting
    assert pool.queued == 1 and held(pool) == {"a": 0, "b": 1}
    on_b.release_now()
    assert (await ticket.wait(1.0)).replica == "b"


async def test_a_removed_replica_runs_out_what_it_holds_and_takes_nothing_new() -> None:
    pool = group(a=1, b=1)
    on_a = pool.acquire_nowait(("a",))
    assert on_a is not None
    pool.resize(2, 100, {"b": 1, "c": 1})  # a goes, c comes
    assert pool.capacity == 2 and held(pool) == {"a": 1, "b": 0, "c": 0}
    taken = [pool.acquire_nowait(("a",)), pool.acquire_nowait(("a",))]
    assert sorted(lease.replica for lease in taken if lease) == ["b", "c"]
    assert pool.acquire_nowait() is None
    on_a.release_now()
    assert [s.name for s in pool.seats()] == ["b", "c"]  # gone once run out
    assert pool.acquire_nowait() is None


@pytest.mark.parametrize("look_ahead", [0, 3])
@pytest.mark.parametrize("seed", range(20))
async def test_whatever_happens_no_replica_runs_more_than_its_slots_and_the_line_is_fifo(
    seed: int, look_ahead: int
) -> None:
    """First come, first served; with a look-ahead, nobody passed over more than twice."""
    rng = random.Random(seed)
    slots = {"a": rng.randint(1, 3), "b": rng.randint(1, 3), "c": rng.randint(1, 3)}
    pool = group(**slots)
    pool.look_ahead, pool.max_bypass = look_ahead, 2
    tickets: list[Any] = []
    leases: list[LocalLease] = []
    waiting: list[asyncio.Task[LocalLease]] = []
    granted: list[int] = []

    async def wait(ticket_no: int, ticket: object) -> LocalLease:
        lease = await ticket.wait(60.0)  # type: ignore[attr-defined]
        granted.append(ticket_no)
        return lease  # type: ignore[no-any-return]

    for step in range(300):
        roll = rng.random()
        if roll < 0.45:
            lease = pool.acquire_nowait(rng.sample(sorted(slots), rng.randint(0, 3)))
            if lease is not None:
                leases.append(lease)
            else:
                ticket = pool.enqueue_nowait(want=rng.choice([None, *sorted(slots)]))
                assert ticket is not None
                tickets.append(ticket)
                waiting.append(asyncio.create_task(wait(step, ticket)))
        elif roll < 0.85 and leases:
            leases.pop(rng.randrange(len(leases))).release_now()
        elif roll < 0.95:
            pool.set_healthy(rng.choice(sorted(slots)), rng.random() < 0.6)
        await asyncio.sleep(0)  # let granted waiters run
        for task in [t for t in waiting if t.done()]:
            waiting.remove(task)
            leases.append(task.result())
        for seat in pool.seats():
            assert seat.active <= seat.slots, (step, seat)
        assert sum(s.active for s in pool.seats()) == pool.active == len(leases)
        assert all(ticket.bypassed <= pool.max_bypass for ticket in tickets)
    if not look_ahead:
        assert granted == sorted(granted)  # first come, first served
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


async def test_a_shared_group_while_redis_is_away_serves_each_replicas_local_share() -> None:
    config = config_from_dict({
        "backends": {"big": {"model": "m", "endpoints": [
            {"url": "http://127.0.0.1:1/v1", "slots": 4},
            {"url": "http://127.0.0.1:2/v1", "slots": 2}]}},
        "routes": {"chat": {"primary": "big"}},
        "coordination": {"mode": "redis", "url": "redis://127.0.0.1:1",
                         "on_redis_down": "fail_open_local", "expected_replicas": 2}})
    breaker = CircuitBreaker(1, 60.0, time.monotonic)
    coordinator = RedisCoordinator(f"redis://127.0.0.1:{closed_port()}", "t", 0.5, breaker)
    breaker.failure()  # Redis is away
    pool = make_pool("big", config.backends["big"], config.coordination, coordinator)
    try:
        assert isinstance(pool, FailoverPool)
        assert pool.capacity == 6
        assert pool.seats() == (Seats("big-0", 2, 0), Seats("big-1", 1, 0))  # the shares
        first, second = await pool.try_acquire(["big-1"]), await pool.try_acquire(["big-1"])
        assert first is not None and second is not None
        assert (first.replica, second.replica) == ("big-1", "big-0")
        pool.set_healthy("big-0", False)  # in both pools: out of the capacity
        assert pool.capacity == 2
        assert [s.healthy for s in pool.shared.seats()] == [False, True]
        assert pool.seats() == (Seats("big-0", 2, 1, healthy=False), Seats("big-1", 1, 1))
        assert await pool.try_acquire() is None
        pool.resize(8, 10, {"big-0": 4, "big-1": 4})
        assert [(s.name, s.slots) for s in pool.seats()] == [("big-0", 2), ("big-1", 2)]
        third = await pool.try_acquire()
        assert third is not None and third.replica == "big-1"
        for lease in (first, second, third):
            await lease.release()
    finally:
        await coordinator.close()


async def test_the_look_ahead_hands_a_freed_slot_to_a_waiter_that_wants_its_replica() -> None:
    pool = group(a=1, b=1)
    pool.look_ahead, pool.max_bypass = 3, 1
    on_a, on_b = pool.acquire_nowait(("a",)), pool.acquire_nowait(("b",))
    assert on_a is not None and on_b is not None
    first = pool.enqueue_nowait(want="a")
    second = pool.enqueue_nowait(want="b")
    third = pool.enqueue_nowait(want="b")
    assert first is not None and second is not None and third is not None
    on_b.release_now()  # b frees: the first waiter wanting b goes, past the head
    passed = await second.wait(1.0)
    assert passed.replica == "b" and first.position == 1
    assert pool.acquire_nowait() is None  # no barging meanwhile
    passed.release_now()  # b again: the head was passed over once, its limit: it goes
    assert (await first.wait(1.0)).replica == "b"
    on_a.release_now()
    assert (await third.wait(1.0)).replica == "a"


async def test_without_look_ahead_the_line_is_first_come_first_served() -> None:
    pool = group(a=1, b=1)
    on_b = pool.acquire_nowait(("b",))
    assert on_b is not None and pool.acquire_nowait(("a",)) is not None
    head, wants_b = pool.enqueue_nowait(want="a"), pool.enqueue_nowait(want="b")
    assert head is not None and wants_b is not None
    on_b.release_now()
    assert (await head.wait(1.0)).replica == "b" and wants_b.position == 1
