"""The `SlotPool` seam: the roles, the snapshot admission decides on, and the errors.

`SlotPool` bounds one backend's concurrency with a bounded queue; `LocalSlotPool`
(`policies.slots.local`) and `RedisSlotPool` (`policies.slots.redis`) are its mechanisms,
side by side under one contract. No I/O here, and no import of an implementation.

    Exception
    ├── QueueTimeout      a ticket waited past its deadline
    ├── QueueShed         a ticket gave its place to a higher class (the queue was full)
    ├── CoordinationError a shared pool's store could not be reached (or its breaker is open)
    └── PoolUnavailable   the pool admits no one now (its store is away and it fails closed)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from policies.config import Priority

SHEDDABLE = Priority.SHEDDABLE.rank


class QueueTimeout(Exception):
    """The ticket waited past its deadline without being granted a slot."""


class QueueShed(Exception):
    """The ticket gave its place to a higher-priority request (the queue was full)."""


class CoordinationError(Exception):
    """A shared pool's store (Redis) could not be reached in time, or its breaker is open."""


class PoolUnavailable(Exception):
    """The pool cannot admit anyone now (its shared store is away and it fails closed)."""

    def __init__(self, pool: str, retry_after_s: float) -> None:
        super().__init__(f"slot pool {pool!r} is unavailable: Redis is unreachable")
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """The facts admission decides on, read at one instant."""

    name: str
    capacity: int
    active: int
    queued: int
    queue_limit: int
    mean_hold_s: float
    sheddable: int = 0  # of `queued`: waiters a higher class may displace

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.active)

    @property
    def queue_room(self) -> int:
        return max(0, self.queue_limit - self.queued)

    def room_for(self, priority: Priority) -> int:
        """Places in the queue for a newcomer of `priority` (counting displaceable ones)."""
        if priority is Priority.SHEDDABLE:
            return self.queue_room
        return self.queue_room + self.sheddable


class Lease(Protocol):
    """One held slot. `release` is idempotent and must run on every path."""

    @property
    def pool(self) -> str: ...

    @property
    def held_s(self) -> float: ...

    def lost(self) -> asyncio.Future[None] | None: ...  # resolved if the slot was taken away

    async def release(self) -> None: ...


class Ticket(Protocol):
    """A place in a pool's queue."""

    @property
    def position(self) -> int: ...  # 1 = next to be served

    async def wait(self, timeout_s: float) -> Lease: ...  # raises QueueTimeout, QueueShed

    async def withdraw(self) -> None: ...  # leave the queue; pass on a slot granted meanwhile

    def eta_s(self) -> float: ...  # expected seconds until this ticket gets a slot


class SlotPool(Protocol):
    name: str
    capacity: int
    queue_limit: int

    @property
    def active(self) -> int: ...

    @property
    def queued(self) -> int: ...

    def snapshot(self) -> PoolSnapshot: ...

    def forecast(self, position: int) -> float: ...  # seconds until `position` gets a slot

    def next_change(self) -> asyncio.Future[None]: ...  # resolved when active/queued change

    def next_move(self) -> asyncio.Future[None]: ...  # resolved when places in line may move

    def watch(self, callback: Callable[[Any], None]) -> Callable[[], None]: ...

    async def try_acquire(self) -> Lease | None: ...  # a free slot now, or None

    async def enqueue(self, priority: Priority = Priority.STANDARD) -> Ticket | None:
        ...  # a ticket, or None when the queue is full (and holds no one to displace)

    def resize(self, capacity: int, queue_limit: int) -> None: ...  # for new admissions


Clock = Callable[[], float]
FORECAST_TTL_S = 0.25
