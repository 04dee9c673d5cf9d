"""What a shared pool does while Redis is away.

`FailoverPool` puts a `RedisSlotPool` first. When a Redis call fails, or the breaker is
open, it either refuses (`fail_closed`: `PoolUnavailable`, answered 503 + Retry-After,
so the backend never sees more than its slots) or serves from a local pool of
floor(slots / expected_replicas), at least 1, in this process (`fail_open_local`). A
request already waiting in the shared line when Redis goes moves to the local line with
the time it has left. Once the breaker closes again, new work goes through Redis; leases
taken locally finish where they are.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from policies.clock.answers import Rates
from policies.config import Priority
from policies.fleet.warmup import Warmup
from policies.health.breaker import BreakerState
from policies.slots.base import (
    CoordinationError,
    Lease,
    PoolSnapshot,
    PoolUnavailable,
    QueueTimeout,
    Seats,
    Share,
    Ticket,
)
from policies.slots.local import LocalSlotPool
from policies.slots.redis import RedisSlotPool, RedisTicket


def local_share(slots: int, expected_replicas: int) -> int:
    """The slots one replica may use on its own: floor(slots / replicas), at least 1."""
    return max(1, slots // expected_replicas)


def local_shares(replicas: Mapping[str, int] | None,
                 expected_replicas: int) -> dict[str, int] | None:
    """Each engine replica's local share (None: a group of one, sized by the pool)."""
    if replicas is None:
        return None
    return {name: local_share(slots, expected_replicas) for name, slots in replicas.items()}


class FailoverTicket:
    def __init__(self, pool: FailoverPool, ticket: RedisTicket, priority: Priority,
                 share: Share | None = None) -> None:
        self._pool = pool
        self._ticket: Ticket = ticket  # a LocalTicket after a move
        self._priority = priority
        self._max_tokens = ticket.max_tokens
        self._share = share

    @property
    def position(self) -> int:
        return self._ticket.position

    async def wait(self, timeout_s: float) -> Lease:
        deadline = time.monotonic() + timeout_s
        try:
            lease: Lease = await self._ticket.wait(timeout_s)
            return lease
        except CoordinationError:
            pass
        # Redis went away while we waited: on to the local line, in the same class
        self._ticket = await self._pool.local_ticket(self._priority, self._max_tokens,
                                                     self._share)
        left = deadline - time.monotonic()
        if left <= 0:
            await self._ticket.withdraw()
            raise QueueTimeout from None
        moved: Lease = await self._ticket.wait(left)
        return moved

    async def withdraw(self) -> None:
        await self._ticket.withdraw()

    def eta_s(self) -> float:
        return self._ticket.eta_s()


class FailoverPool:
    """A Redis-shared pool with a fallback for when Redis is unreachable."""

    def __init__(self, shared: RedisSlotPool, local: LocalSlotPool | None,
                 expected_replicas: int = 1) -> None:
        self.shared = shared
        self.local = local  # None: fail closed
        self.expected_replicas = expected_replicas
        self.name = shared.name
        self.capacity = shared.capacity
        self.queue_limit = shared.queue_limit

    @property
    def cold(self) -> Warmup | None:
        return self.shared.cold

    @cold.setter
    def cold(self, warmup: Warmup | None) -> None:
        """Both lines forecast a cold group's warm-up (policies/fleet/warmup.py)."""
        self.shared.cold = warmup
        if self.local is not None:
            self.local.cold = warmup

    @property
    def degraded(self) -> bool:
        return self.shared.coordinator.breaker.state is not BreakerState.CLOSED

    @property
    def active(self) -> int:
        return self.shared.active + (self.local.active if self.local else 0)

    @property
    def queued(self) -> int:
        return self.shared.queued + (self.local.queued if self.local else 0)

    async def recount(self) -> None:
        await self.shared.recount()

    def snapshot(self) -> PoolSnapshot:
        if self.degraded and self.local is not None:
            return self.local.snapshot()
        return self.shared.snapshot()

    pins = False  # its line is shared: a waiter takes the first slot freed in the group

    def replica_wait(self, replica: str, rates: Rates | None = None) -> float:
        """The group's next slot at the group's rates, as the shared pool's (no pins, no
        replica's own rates: `RedisSlotPool.replica_wait`)."""
        return self.forecast(1)

    def forecast(self, position: int) -> float:
        if self.degraded and self.local is not None:
            return self.local.forecast(position)
        return self.shared.forecast(position)

    def next_change(self) -> asyncio.Future[None]:
        if self.degraded and self.local is not None:
            return self.local.next_change()
        return self.shared.next_change()

    def next_move(self) -> asyncio.Future[None]:
        if self.degraded and self.local is not None:
            return self.local.next_move()
        return self.shared.next_move()

    def watch(self, callback: Callable[[Any], None]) -> Callable[[], None]:
        def relay(_: object) -> None:
            callback(self)

        unwatch = [self.shared.watch(relay)]
        if self.local is not None:
            unwatch.append(self.local.watch(relay))

        def stop() -> None:
            for undo in unwatch:
                undo()

        return stop

    def seats(self) -> tuple[Seats, ...]:
        """A group's replicas as the pool serving now counts them (each one's local share
        while Redis is away); a group of one counts both pools' holders."""
        if self.shared.group.slots.keys() == {self.name}:
            return (Seats(self.name, self.capacity, self.active),)
        if self.degraded and self.local is not None:
            return self.local.seats()
        return self.shared.seats()

    def set_healthy(self, replica: str, healthy: bool) -> None:
        self.shared.set_healthy(replica, healthy)
        self.capacity = self.shared.capacity
        if self.local is not None:
            self.local.set_healthy(replica, healthy)

    def resize(self, capacity: int, queue_limit: int,
               replicas: Mapping[str, int] | None = None,
               unready: Collection[str] = ()) -> None:
        self.shared.resize(capacity, queue_limit, replicas, unready)
        self.capacity, self.queue_limit = self.shared.capacity, queue_limit
        if self.local is not None:
            shares = local_shares(replicas, self.expected_replicas)
            self.local.resize(local_share(capacity, self.expected_replicas), queue_limit,
                              shares, unready)

    async def try_acquire(self, prefer: Sequence[str] = (),
                          share: Share | None = None) -> Lease | None:
        try:
            return await self.shared.try_acquire(prefer, share)
        except CoordinationError:
            return self._local().acquire_nowait(prefer, share)

    async def enqueue(self, priority: Priority = Priority.STANDARD,
                      want: str | None = None,
                      max_tokens: int | None = None,
                      share: Share | None = None, hold_s: float = 0.0,
                      beyond: int = 0) -> Ticket | None:
        try:
            ticket = await self.shared.enqueue(priority, max_tokens=max_tokens, share=share,
                                               beyond=beyond)
        except CoordinationError:
            return self._local().enqueue_nowait(priority, max_tokens=max_tokens, share=share,
                                                beyond=beyond)
        return None if ticket is None else FailoverTicket(self, ticket, priority, share)

    async def local_ticket(self, priority: Priority, max_tokens: int | None = None,
                           share: Share | None = None) -> Ticket:
        ticket = self._local().enqueue_nowait(priority, max_tokens=max_tokens, share=share)
        if ticket is None:
            raise PoolUnavailable(self.name, self.retry_after_s())
        return ticket

    def _local(self) -> LocalSlotPool:
        if self.local is None:
            raise PoolUnavailable(self.name, self.retry_after_s())
        return self.local

    def retry_after_s(self) -> float:
        return max(1.0, math.ceil(self.shared.coordinator.breaker.retry_in_s()))
