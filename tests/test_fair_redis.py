"""A `fair` shared line across gateway processes: three RedisSlotPool views of one 2-slot
pool (three coordinators on one real Redis), tenants' waiters spread over them.

Each step releases the oldest of the two leases held, so exactly one waiter is granted:
the order of grants is the line's order, whichever process holds the ticket.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import pytest

from policies.clock.forecast import Progress
from policies.config import Priority, QueueOrder
from policies.slots import Lease, SlotPool, Ticket
from policies.slots.base import Share
from policies.slots.redis import RedisSlotPool
from tests.support import RedisServer
from tests.support.pools import (
    BOUND_S,
    PoolFactory,
    acquired,
    idle,
    next_granted,
    until,
    waiting,
)

ANSWER = 100  # each answer's output tokens, charged at its release


@pytest.fixture
async def fair_factory(redis_server: RedisServer) -> AsyncIterator[PoolFactory]:
    factory = PoolFactory(redis_server.url, QueueOrder.FAIR)
    try:
        yield factory
    finally:
        await factory.close()
    assert not factory.violations, f"states outside the bounds: {factory.violations}"


@dataclass
class Line:
    """Waiters of tenants over several processes' views of one pool, served one at a time."""

    pools: Sequence[SlotPool]
    held: list[Lease] = field(default_factory=list)  # oldest first
    pending: dict[asyncio.Task[Lease], tuple[str, int]] = field(default_factory=dict)
    served: list[tuple[str, int]] = field(default_factory=list)  # (tenant, its n-th)
    made: int = 0
    arrived: Counter[str] = field(default_factory=Counter)

    async def fill(self) -> None:
        """Every slot held (by newcomers of no tenant), so that arrivals wait."""
        for pool in self.pools[:2]:
            self.held.append(await acquired(pool))

    async def arrive(self, tenant: str, count: int, weight: float = 1.0,
                     prompt: int = 0) -> None:
        for _ in range(count):
            pool = self.pools[self.made % len(self.pools)]  # spread over the processes
            self.made += 1
            ticket = await pool.enqueue(Priority.STANDARD, max_tokens=ANSWER,
                                        share=Share(tenant, weight, prompt))
            assert ticket is not None
            self.pending[await waiting(ticket)] = (tenant, self.arrived[tenant])
            self.arrived[tenant] += 1

    async def step(self) -> tuple[str, int]:
        """Release the oldest lease (its answer charged): the next waiter is granted."""
        oldest = self.held.pop(0)
        oldest.charge(ANSWER)
        await oldest.release()
        tasks = set(self.pending)
        task = await next_granted(tasks)
        self.held.append(task.result())
        self.served.append(self.pending.pop(task))
        return self.served[-1]

    def of(self, tenant: str) -> list[int]:
        return [n for t, n in self.served if t == tenant]

    def charged(self, tenant: str) -> int:
        """Its answers' tokens charged: those released (all but the last two granted)."""
        return sum(ANSWER for t, _ in self.served[:-2] if t == tenant)

    async def drain(self, factory: PoolFactory) -> None:
        while self.pending:
            await self.step()
        for lease in self.held:
            await lease.release()
        await idle(factory, *self.pools)


async def test_a_light_tenant_is_not_starved_by_a_heavy_one(fair_factory: PoolFactory) -> None:
    line = Line(await fair_factory(capacity=2, queue_limit=64, replicas=3))
    await line.fill()
    await line.arrive("heavy", 40)
    await line.arrive("light", 4)
    for _ in range(10):
        await line.step()
    assert line.of("light") == [0, 1, 2, 3], line.served  # FIFO across processes: 41st
    assert line.of("heavy") == list(range(6))  # first come, first served within a tenant
    await line.drain(fair_factory)
    assert line.of("heavy") == list(range(40))


async def test_weights_share_the_tokens_served(fair_factory: PoolFactory) -> None:
    line = Line(await fair_factory(capacity=2, queue_limit=64, replicas=3))
    await line.fill()
    for _ in range(12):  # interleaved arrivals: neither is first by arrival
        await line.arrive("double", 1, weight=2)
        await line.arrive("single", 1, weight=1)
    for done in range(1, 19):
        await line.step()
        # tokens served / weight: within the answers in flight (one per slot) of each other
        assert abs(line.charged("double") / 2 - line.charged("single")) <= 2 * ANSWER, (
            done, line.served)
    assert line.of("double") == list(range(12))  # 2:1 in requests of equal answers
    assert line.of("single") == list(range(6))
    await line.drain(fair_factory)


async def test_a_tenant_back_from_idle_does_not_starve_others(
        fair_factory: PoolFactory) -> None:
    line = Line(await fair_factory(capacity=2, queue_limit=64, replicas=3))
    await line.fill()
    await line.arrive("early", 2)
    await line.step()
    await line.step()  # early's two served: its counter is low; nobody waits now
    await line.arrive("busy", 20)
    for _ in range(10):
        await line.step()  # busy served alone: its counter grows well past early's
    await line.arrive("early", 10)
    for _ in range(8):
        await line.step()
    back = line.served[-8:]
    assert sum(t == "busy" for t, _ in back) >= 3, back  # early is lifted: no credit
    await line.drain(fair_factory)


async def test_a_newcomer_ahead_moves_other_processes_waiters_back(
        fair_factory: PoolFactory) -> None:
    """A place can move back: the processes hear of it by a wake-up (no re-check here)."""
    a, b = await fair_factory(capacity=2, queue_limit=8, replicas=2, recheck_s=60)
    assert isinstance(a, RedisSlotPool)
    holder = await acquired(a)
    heavy = await (await enqueued(a, "heavy")).wait(BOUND_S)  # a slot was free
    late = await enqueued(a, "heavy")
    medium = [await enqueued(b, "medium") for _ in range(2)]
    granted = await waiting(medium[0])
    heavy.charge(1000)
    await heavy.release()  # heavy's counter passes medium's: medium goes first
    lease = await granted
    a.wake()  # a re-check (a grant wakes no one: places only move up)
    await until(lambda: late.position == 2, a, what="heavy behind medium")
    light = await enqueued(b, "light")  # lifted to medium's counter
    assert light.position == 2
    await until(lambda: late.position == 3, a, what="heavy behind light")
    for ticket in (late, medium[1], light):
        await ticket.withdraw()
    await lease.release()
    await holder.release()
    await idle(fair_factory, a, b)


async def test_answers_are_charged_to_their_tenant(fair_factory: PoolFactory) -> None:
    """A grant charges its prompt (a free slot's too), its release the answer's tokens:
    `charge`'s count when given, else the relay's."""
    (pool,) = await fair_factory(capacity=1, queue_limit=4)
    assert isinstance(pool, RedisSlotPool)
    holder = await pool.try_acquire(share=Share("free", prompt_tokens=7))
    assert holder is not None
    holder.charge(3)
    counted = await pool.enqueue(share=Share("counted", weight=2, prompt_tokens=10))
    relayed = await pool.enqueue(share=Share("relayed", prompt_tokens=4))
    assert counted is not None and relayed is not None
    first = await waiting(counted)
    second = await waiting(relayed)
    await holder.release()
    lease = await first
    lease.charge(90)
    await lease.release()
    lease = await second
    lease.follow(Progress(ANSWER, produced=Relay(30)))
    await lease.release()
    served = await pool.coordinator.client.hgetall(pool.keys[11])
    assert {bytes.fromhex(_text(k)).decode(): float(v) for k, v in served.items()} == {
        "free": 7 + 3, "counted": 7 + (10 + 90) / 2, "relayed": 7 + 4 + 30}  # lifted to 7
    await idle(fair_factory, pool)


def _text(raw: bytes | str) -> str:
    return raw if isinstance(raw, str) else raw.decode()


async def enqueued(pool: SlotPool, tenant: str) -> Ticket:
    ticket = await pool.enqueue(share=Share(tenant))
    assert ticket is not None
    return ticket


@dataclass
class Relay:
    """A stream's relay counter (`policies.clock.forecast.Produced`)."""

    seen_events: int
