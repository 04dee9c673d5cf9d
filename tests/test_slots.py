"""LocalSlotPool: FIFO hand-off, no barging, no leaked slot on any exit path."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.clock.holds import HoldTimeModel
from policies.config import Priority
from policies.slots import LocalLease, LocalSlotPool, LocalTicket, QueueTimeout


def make_pool(capacity: int = 1, queue_limit: int = 10) -> LocalSlotPool:
    return LocalSlotPool("p", capacity, queue_limit, HoldTimeModel(1.0))


async def test_acquire_up_to_capacity_then_none() -> None:
    pool = make_pool(capacity=2)
    a, b = pool.acquire_nowait(), pool.acquire_nowait()
    assert a is not None and b is not None
    assert pool.acquire_nowait() is None
    assert pool.snapshot().active == 2
    await a.release()
    await a.release()  # idempotent: the second call frees nothing more
    assert pool.active == 1
    await b.release()
    assert pool.active == 0


async def test_release_hands_slot_to_oldest_waiter_in_order() -> None:
    pool = make_pool(capacity=1)
    first = pool.acquire_nowait()
    assert first is not None
    tickets = [pool.enqueue_nowait() for _ in range(3)]
    assert [t.position for t in tickets if t] == [1, 2, 3]
    order: list[int] = []

    async def waiter(i: int) -> None:
        ticket = tickets[i]
        assert ticket is not None
        lease = await ticket.wait(10)
        order.append(i)
        await lease.release()

    tasks = [asyncio.create_task(waiter(i)) for i in (2, 0, 1)]  # start order must not matter
    await asyncio.sleep(0)
    await first.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    assert (pool.active, pool.queued) == (0, 0)


async def test_handoff_keeps_slot_taken_so_newcomers_cannot_barge() -> None:
    pool = make_pool(capacity=1)
    lease = pool.acquire_nowait()
    assert lease is not None
    ticket = pool.enqueue_nowait()
    assert ticket is not None
    await lease.release()
    # The slot now belongs to the waiter even before it has run: a newcomer gets nothing.
    assert pool.active == 1
    assert pool.acquire_nowait() is None
    granted = await ticket.wait(1)
    await granted.release()
    assert pool.active == 0


async def test_newcomer_queues_behind_waiters_even_if_capacity_appears() -> None:
    pool = make_pool(capacity=1)
    lease = pool.acquire_nowait()
    assert lease is not None
    assert pool.enqueue_nowait() is not None
    assert pool.acquire_nowait() is None


async def test_queue_limit() -> None:
    pool = make_pool(capacity=1, queue_limit=2)
    assert pool.acquire_nowait() is not None
    assert pool.enqueue_nowait() is not None
    assert pool.enqueue_nowait() is not None
    assert pool.enqueue_nowait() is None


async def test_queue_timeout_leaves_queue() -> None:
    pool = make_pool(capacity=1)
    lease = pool.acquire_nowait()
    assert lease is not None
    ticket = pool.enqueue_nowait()
    assert ticket is not None
    with pytest.raises(QueueTimeout):
        await ticket.wait(0.01)
    assert pool.queued == 0
    await lease.release()
    assert pool.active == 0


async def test_cancelled_waiter_leaves_queue_at_once() -> None:
    pool = make_pool(capacity=1)
    lease = pool.acquire_nowait()
    assert lease is not None
    ticket = pool.enqueue_nowait()
    assert ticket is not None
    task = asyncio.create_task(ticket.wait(10))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pool.queued == 0
    await lease.release()
    assert pool.active == 0


async def test_waiter_cancelled_at_the_instant_of_handoff_passes_slot_on() -> None:
    pool = make_pool(capacity=1)
    lease = pool.acquire_nowait()
    assert lease is not None
    t1, t2 = pool.enqueue_nowait(), pool.enqueue_nowait()
    assert t1 is not None and t2 is not None
    task1 = asyncio.create_task(t1.wait(10))
    task2 = asyncio.create_task(t2.wait(10))
    await asyncio.sleep(0)
    await lease.release()  # hands the slot to t1 ...
    task1.cancel()  # ... which is cancelled before it could run
    with pytest.raises(asyncio.CancelledError):
        await task1
    second = await task2  # t1's slot passed straight on
    assert pool.active == 1
    await second.release()
    assert (pool.active, pool.queued) == (0, 0)


async def test_withdraw_before_wait_passes_granted_slot_on() -> None:
    pool = make_pool(capacity=1)
    lease = pool.acquire_nowait()
    assert lease is not None
    ticket = pool.enqueue_nowait()
    assert ticket is not None
    await lease.release()
    assert pool.active == 1
    await ticket.withdraw()
    assert (pool.active, pool.queued) == (0, 0)


async def test_withdraw_after_claim_does_not_release_claimed_lease() -> None:
    pool = make_pool(capacity=1)
    lease = pool.acquire_nowait()
    assert lease is not None
    ticket = pool.enqueue_nowait()
    assert ticket is not None
    await lease.release()
    mine = await ticket.wait(1)
    await ticket.withdraw()
    assert pool.active == 1
    await mine.release()
    assert pool.active == 0


async def test_release_is_timed_and_watchers_see_changes() -> None:
    now = [100.0]
    pool = LocalSlotPool("p", 1, 1, HoldTimeModel(9.0), clock=lambda: now[0])
    seen: list[tuple[int, int]] = []
    unwatch = pool.watch(lambda p: seen.append((p.active, p.queued)))
    lease = pool.acquire_nowait()
    assert isinstance(lease, LocalLease)
    now[0] += 2.5
    assert lease.held_s == 2.5
    await lease.release()
    unwatch()
    assert pool.estimator.mean_s == 9.0  # the backend's clock learns it, not the pool
    assert seen == [(1, 0), (0, 0)]


async def test_forecast_uses_running_ages_and_is_shared_until_a_change() -> None:
    now = [0.0]
    pool = LocalSlotPool("p", 1, 4, HoldTimeModel(10.0), clock=lambda: now[0])
    for _ in range(5):  # learn: every request holds its slot 10 s
        lease = pool.acquire_nowait()
        assert lease is not None
        now[0] += 10.0
        await lease.release()
        pool.estimator.observe(lease.held_s)  # as the gateway tells its backend's clock
    running = pool.acquire_nowait()
    assert running is not None
    now[0] += 8.0  # it has run 8 of its ~10 s
    first = pool.forecast(1)
    assert 0 < first < 10.0  # sooner than a fresh hold: the running request is nearly done
    assert pool.forecast(2) > first
    ticket = pool.enqueue_nowait()  # a change: forecasts are recomputed
    assert ticket is not None and ticket.eta_s() == pool.forecast(1)
    await ticket.withdraw()
    await running.release()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["join", "serve", "leave"]),
                          st.integers(0, 2), st.integers(0, 50)), max_size=60))
async def test_positions_match_a_walk_of_the_lines(ops: list[tuple[str, int, int]]) -> None:
    """Places computed from sequence numbers and gaps equal the places counted one by one,
    whatever mix of arrivals, hand-offs, withdrawals and sheddings came before."""
    pool = make_pool(capacity=1, queue_limit=6)
    held = pool.acquire_nowait()
    assert held is not None
    line: list[LocalTicket] = []  # the reference: by class, then by arrival
    for op, rank, pick in ops:
        if op == "join":
            full = len(line) == pool.queue_limit
            ticket = pool.enqueue_nowait(list(Priority)[rank])
            if ticket is None:
                continue
            if full:  # it took the place of the newest sheddable waiter
                line.remove(max((t for t in line if t.rank == 2), key=lambda t: t.seq))
            at = sum(t.rank <= rank for t in line)
            line.insert(at, ticket)
        elif op == "serve" and line:
            await held.release()
            line.pop(0)
            held = await line_head_lease(pool)
        elif op == "leave" and line:
            gone = line.pop(pick % len(line))
            await gone.withdraw()
        assert [t.position for t in line] == list(range(1, len(line) + 1))
    for ticket in line:
        await ticket.withdraw()
    await held.release()


async def line_head_lease(pool: LocalSlotPool) -> LocalLease:
    """The lease a release just handed to the head of the line (a future already set)."""
    for ticket in list(pool._leases):
        return ticket
    raise AssertionError("nothing was handed over")


async def test_an_arrival_at_the_back_moves_nobody() -> None:
    pool = make_pool(capacity=1)
    held = pool.acquire_nowait()
    assert held is not None
    first = pool.enqueue_nowait(Priority.STANDARD)
    moved = pool.next_move()
    pool.enqueue_nowait(Priority.STANDARD)  # behind: no waiter need look again
    pool.enqueue_nowait(Priority.SHEDDABLE)
    assert not moved.done()
    ahead = pool.enqueue_nowait(Priority.CRITICAL)  # ahead of the sheddable one
    assert moved.done() and ahead is not None and ahead.position == 1
    assert first is not None and first.position == 2
    moved = pool.next_move()
    await held.release()  # the head is served: everyone moves up
    assert moved.done() and first.position == 1
