"""A local pool with `queue_order: fair`, driven directly (no HTTP): a light tenant is not
kept behind a heavy one's backlog, weights share the tokens, a tenant back from idle is
lifted (no credit), FIFO within a tenant, classes first, the streamed tokens count while
they stream, places may move back (and `next_move` says so), and a switch of order keeps
the waiters, a resize and shedding work as in a fifo line. Every grant is a release's
hand-off, awaited: nothing sleeps."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from policies.clock.forecast import Progress
from policies.clock.holds import HoldTimeModel
from policies.config import Priority, QueueOrder
from policies.slots import FORECAST_TTL_S, Lease, LocalSlotPool, Share, Ticket
from tests.support.pools import acquired, next_granted, waiting

PROMPT, ANSWER = 10, 100  # each request's tokens in these tests


def fair_pool(capacity: int, queue_limit: int = 200) -> LocalSlotPool:
    pool = LocalSlotPool("p", capacity, queue_limit, HoldTimeModel(1.0))
    pool.order_by(QueueOrder.FAIR)
    return pool


async def line_up(pool: LocalSlotPool, tenant: str, n: int, weight: float = 1.0,
                  priority: Priority = Priority.STANDARD,
                  tasks: dict[asyncio.Task[Lease], tuple[str, int]] | None = None,
                  ) -> dict[asyncio.Task[Lease], tuple[str, int]]:
    """`n` waiters of `tenant`, each waiting: task -> (tenant, its number)."""
    tasks = {} if tasks is None else tasks
    for i in range(n):
        ticket = await pool.enqueue(priority, max_tokens=ANSWER,
                                    share=Share(tenant, weight, PROMPT))
        assert ticket is not None
        tasks[await waiting(ticket)] = (tenant, i)
    return tasks


async def serve(held: list[Lease], tasks: dict[asyncio.Task[Lease], tuple[str, int]],
                grants: int | None = None) -> list[tuple[str, int]]:
    """Release the oldest lease (its answer ANSWER tokens) and note who the slot goes to,
    `grants` times (all: until no one waits)."""
    pending = {t for t in tasks if not t.done()}
    order: list[tuple[str, int]] = []
    while pending and (grants is None or len(order) < grants):
        lease = held.pop(0)
        lease.charge(ANSWER)
        await lease.release()
        task = await next_granted(pending)
        order.append(tasks[task])
        held.append(await task)
    return order


async def test_a_light_tenant_is_not_kept_behind_a_heavy_backlog() -> None:
    pool = fair_pool(capacity=2)
    held = [await acquired(pool), await acquired(pool)]
    tasks = await line_up(pool, "heavy", 40)
    await line_up(pool, "light", 4, tasks=tasks)
    order = await serve(held, tasks)
    light = [k for k, (tenant, _) in enumerate(order) if tenant == "light"]
    assert len(light) == 4 and max(light) < 10, order[:12]  # not behind 40
    for tenant in ("heavy", "light"):  # first come, first served within a tenant
        mine = [i for t, i in order if t == tenant]
        assert mine == sorted(mine)
    for lease in held:
        await lease.release()
    assert (pool.active, pool.queued) == (0, 0)


async def test_weights_two_to_one_share_tokens_two_to_one() -> None:
    pool = fair_pool(capacity=1)
    held = [await acquired(pool)]
    tasks = await line_up(pool, "double", 30, weight=2)
    await line_up(pool, "single", 30, tasks=tasks)
    order = await serve(held, tasks, grants=45)
    tokens = {"double": 0, "single": 0}
    for tenant, _ in order:  # at every grant: within one request's tokens of 2:1
        tokens[tenant] += PROMPT + ANSWER
        assert abs(tokens["double"] / 2 - tokens["single"]) <= PROMPT + ANSWER, order
    assert tokens["double"] == 2 * tokens["single"]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await held[0].release()


async def test_a_tenant_back_from_idle_is_lifted_and_gets_its_share() -> None:
    pool = fair_pool(capacity=1)
    held = [await acquired(pool)]
    idle = await line_up(pool, "returning", 2)  # served a little, long ago
    await serve(held, idle)
    tasks = await line_up(pool, "a", 30)
    await line_up(pool, "b", 30, tasks=tasks)
    await serve(held, tasks, grants=30)  # a and b served a lot meanwhile
    await line_up(pool, "returning", 20, tasks=tasks)
    order = await serve(held, tasks, grants=12)
    counts = {tenant: sum(1 for t, _ in order if t == tenant) for tenant in ("a", "b")}
    returning = len(order) - sum(counts.values())
    assert returning <= 12 // 3 + 1, order  # its share, no credit for the time idle
    assert counts["a"] >= 3 and counts["b"] >= 3, order
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await held[0].release()


async def test_classes_first_then_fair_within_each() -> None:
    pool = fair_pool(capacity=1)
    held = [await acquired(pool)]
    tasks = await line_up(pool, "light", 2, priority=Priority.SHEDDABLE)
    await line_up(pool, "heavy", 3, priority=Priority.CRITICAL, tasks=tasks)
    await line_up(pool, "light", 1, priority=Priority.STANDARD, tasks=tasks)
    order = await serve(held, tasks)
    assert order == [("heavy", 0), ("heavy", 1), ("heavy", 2), ("light", 0),
                     ("light", 0), ("light", 1)]
    await held[0].release()


@dataclass
class Relay:
    """A stream's relay counter as the pool reads it (`policies.clock.forecast.Produced`)."""

    seen_events: int = 0


async def test_streamed_tokens_count_while_they_stream() -> None:
    now = [0.0]
    pool = LocalSlotPool("p", 1, 10, HoldTimeModel(1.0), clock=lambda: now[0])
    pool.order_by(QueueOrder.FAIR)
    first = await pool.enqueue(share=Share("a", 1, 0))
    assert first is not None
    lease = await first.wait(1.0)  # granted at once: a free slot, an empty line
    relay = Relay()
    lease.follow(Progress(ANSWER, relay))
    a = await pool.enqueue(share=Share("a", 1, 0))
    b = await pool.enqueue(share=Share("b", 1, 0))
    assert a is not None and b is not None
    assert (a.position, b.position) == (1, 2)  # even: first come, first served
    relay.seen_events = 5  # a's answer is streaming: a is now ahead of b by 5 tokens
    now[0] += FORECAST_TTL_S * 2  # places are worked out again at the next change, or by then
    assert (b.position, a.position) == (1, 2)
    await lease.release()  # no `charge`: the relay's count is folded in
    assert await b.wait(1.0) is not None
    assert a.position == 1
    await a.withdraw()


async def test_a_place_moves_back_and_next_move_says_so() -> None:
    pool = fair_pool(capacity=1)
    lease = await acquired(pool)
    heavy = [await pool.enqueue(share=Share("heavy", 1, PROMPT)) for _ in range(3)]
    assert [t.position for t in heavy if t is not None] == [1, 2, 3]
    moved = pool.next_move()
    light = await pool.enqueue(share=Share("light", 1, PROMPT))
    assert moved.done()  # an arrival may move places in a fair line
    assert light is not None and light.position == 2  # after heavy's first, ahead of the rest
    assert [t.position for t in heavy if t is not None] == [1, 3, 4]  # moved back
    assert pool.forecast(4) >= pool.forecast(3)
    for ticket in [*heavy, light]:
        assert ticket is not None
        await ticket.withdraw()
    await lease.release()


async def test_a_switch_of_order_keeps_the_waiters_in_arrival_order() -> None:
    pool = LocalSlotPool("p", 1, 10, HoldTimeModel(1.0))
    lease = await acquired(pool)
    tickets: list[Ticket] = []
    for tenant in ("h", "h", "h", "l"):
        queued = await pool.enqueue(share=Share(tenant, 1, PROMPT))
        assert queued is not None
        tickets.append(queued)
    assert [t.position for t in tickets] == [1, 2, 3, 4]
    pool.order_by(QueueOrder.FAIR)  # a reload: the tenants were kept
    assert [t.position for t in tickets] == [1, 3, 4, 2]
    pool.order_by(QueueOrder.FIFO)
    assert [t.position for t in tickets] == [1, 2, 3, 4]
    for ticket in tickets:
        await ticket.withdraw()
    await lease.release()
    assert (pool.active, pool.queued) == (0, 0)


async def test_a_resize_serves_the_waiters_in_fair_order() -> None:
    pool = fair_pool(capacity=1)
    lease = await acquired(pool)
    tickets = {}
    for tenant, n in (("heavy", 3), ("light", 1)):
        for i in range(n):
            ticket = await pool.enqueue(share=Share(tenant, 1, PROMPT))
            assert ticket is not None
            tickets[tenant, i] = ticket
    pool.resize(3, 200)  # two more slots: the first two of the fair order take them
    assert {k for k, t in tickets.items() if t.position == 0} == {("heavy", 0), ("light", 0)}
    assert (tickets["heavy", 1].position, tickets["heavy", 2].position) == (1, 2)
    for key in (("heavy", 0), ("light", 0), ("heavy", 1), ("heavy", 2)):
        await (await tickets[key].wait(1.0)).release()  # each slot handed over in turn
    await lease.release()
    assert (pool.active, pool.queued) == (0, 0)


async def test_a_full_fair_line_sheds_its_newest_sheddable_waiter() -> None:
    pool = fair_pool(capacity=1, queue_limit=3)
    lease = await acquired(pool)
    line: list[Ticket] = []
    for tenant in ("light", "heavy", "heavy"):
        ticket = await pool.enqueue(Priority.SHEDDABLE, share=Share(tenant, 1, PROMPT))
        assert ticket is not None
        line.append(ticket)
    gold = await pool.enqueue(Priority.CRITICAL, share=Share("heavy", 1, PROMPT))
    assert gold is not None and gold.position == 1
    assert pool.queued == 3 and [t.position for t in line] == [2, 3, 0]  # the newest shed
    for left in (gold, *line):
        await left.withdraw()
    await lease.release()
    assert (pool.active, pool.queued) == (0, 0)


async def test_a_free_slot_is_charged_to_its_tenant() -> None:
    # The heavy tenant took both slots while nobody waited: its answers count against it,
    # so the light tenant, lining up after its waiter, is served first.
    pool = fair_pool(capacity=2)
    held = [await pool.try_acquire((), Share("heavy", 1.0, PROMPT)) for _ in range(2)]
    assert all(lease is not None for lease in held)
    assert pool._fair is not None and pool._fair.live("heavy") == 2 * PROMPT
    tasks = await line_up(pool, "heavy", 1)
    await line_up(pool, "light", 1, tasks=tasks)
    order = await serve([lease for lease in held if lease is not None], tasks)
    assert order == [("light", 0), ("heavy", 0)]
