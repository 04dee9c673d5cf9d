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
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from policies.clock.answers import Rates
from policies.clock.forecast import Progress
from policies.config import Priority
from policies.fleet.warmup import Warmup

SHEDDABLE = Priority.SHEDDABLE.rank


class QueueTimeout(Exception):
    """The ticket waited past its deadline without being granted a slot."""


class QueueShed(Exception):
    """The ticket gave its place to a higher-priority request (the queue was full)."""


class CoordinationError(Exception):
    """A shared pool's store (Redis) could not be reached in time, or its breaker is open."""


class CircuitOpen(CoordinationError):
    """The breaker is open: the call was not sent."""


class CoordinationBusy(CoordinationError):
    """Every connection of this process to Redis stayed in use past the wait bound: the
    process is busy, Redis is not away (the breaker does not count it; the call was not
    sent)."""


class PoolUnavailable(Exception):
    """The pool cannot admit anyone now (its shared store is away and it fails closed)."""

    def __init__(self, pool: str, retry_after_s: float) -> None:
        super().__init__(f"slot pool {pool!r} is unavailable: Redis is unreachable")
        self.retry_after_s = retry_after_s


# Not frozen, though never changed once made: one is made for every request, and a frozen
# dataclass sets each field through object.__setattr__ (a Run: 0.92 -> 0.24 us to make).
@dataclass(slots=True)
class PoolSnapshot:
    """The facts admission decides on, read at one instant."""

    name: str
    capacity: int
    active: int
    queued: int
    queue_limit: int
    mean_hold_s: float
    sheddable: int = 0  # of `queued`: waiters a higher class may displace
    pinned: int = 0  # of `queued`: waiters that take a slot on one replica alone, for now

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.active)

    @property
    def open(self) -> bool:
        """May a newcomer take a slot now? One is free and no waiter would take it (those
        waiting are pinned to other replicas)."""
        return self.capacity > self.active and self.queued <= self.pinned

    @property
    def queue_room(self) -> int:
        return max(0, self.queue_limit - self.queued)

    def room_for(self, priority: Priority) -> int:
        """Places in the queue for a newcomer of `priority` (counting displaceable ones)."""
        if priority is Priority.SHEDDABLE:
            return self.queue_room
        return self.queue_room + self.sheddable


@dataclass(frozen=True, slots=True)
class Seats:
    """One replica of a pool's group at one instant: its slots and how many are held. An
    unhealthy replica's slots are outside the pool's capacity (it runs out what it holds)."""

    name: str
    slots: int
    active: int
    healthy: bool = True

    @property
    def free(self) -> int:
        return max(0, self.slots - self.active) if self.healthy else 0


@dataclass(slots=True)
class Share:
    """Whose a waiter is, for a `fair` line: its tenant, the tenant's weight (served tokens
    count 1/weight against it) and its prompt's estimated tokens (charged at its grant)."""

    tenant: str
    weight: float = 1.0
    prompt_tokens: int = 0


class Lease(Protocol):
    """One held slot, on one replica. `release` is idempotent and must run on every path."""

    released: bool  # set by its first release

    @property
    def pool(self) -> str: ...

    @property
    def replica(self) -> str: ...

    @property
    def held_s(self) -> float: ...

    def lost(self) -> asyncio.Future[None] | None: ...  # resolved if the slot was taken away

    # Its answer's cap and relay counter, read by the pool's forecast (this process only).
    def follow(self, progress: Progress) -> None: ...

    # Its answer's output tokens, as counted when it ended (before `release`): what a
    # `fair` line charges its tenant beyond the prompt (else the relay's count so far).
    def charge(self, output_tokens: int) -> None: ...

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
    cold: Warmup | None  # a discovered group's warm-up, while it has no replica ready

    @property
    def active(self) -> int: ...

    @property
    def queued(self) -> int: ...

    def snapshot(self) -> PoolSnapshot: ...

    # Read the counts again where they are shared: a process that neither waits nor takes
    # a slot there hears of no lease that lapsed (another process died holding it).
    async def recount(self) -> None: ...

    def forecast(self, position: int) -> float: ...  # seconds until `position` gets a slot

    pins: bool  # may a waiter be pinned to one replica for a while (`enqueue`'s `hold_s`)

    def next_change(self) -> asyncio.Future[None]: ...  # resolved when active/queued change

    def next_move(self) -> asyncio.Future[None]: ...  # resolved when places in line may move

    def watch(self, callback: Callable[[Any], None]) -> Callable[[], None]: ...

    # A free slot now (on the first replica of `prefer` that has one, else any), or None.
    # `share`: its tenant, charged in a `fair` pool's counters for what it is served.
    async def try_acquire(self, prefer: Sequence[str] = (),
                          share: Share | None = None) -> Lease | None: ...

    # A ticket, or None when the queue is full (and holds no one to displace). `want`: the
    # replica of the group it would rather run on (a hint a pool may use, or not); with
    # `hold_s` > 0, a pool that `pins` takes it for that replica alone for that long.
    # `max_tokens`: its request's cap, for the forecast of the places behind it.
    # `share`: its tenant, for a `fair` line (None: a tenant of its own, weight 1).
    # `beyond`: places past `queue_limit` it may take (a slot a batch line gives back is
    # on its way to it: router.batch.preempt).
    async def enqueue(self, priority: Priority = Priority.STANDARD,
                      want: str | None = None,
                      max_tokens: int | None = None,
                      share: Share | None = None, hold_s: float = 0.0,
                      beyond: int = 0) -> Ticket | None: ...

    # Expected seconds until a slot on `replica` would serve one more waiter pinned to it
    # (`enqueue(want=replica, hold_s=...)`), at that replica's own `rates` where given
    # (`Clock.rates_on`); a pool that pins no one: its `forecast(1)`, at the group's.
    def replica_wait(self, replica: str, rates: Rates | None = None) -> float: ...

    def seats(self) -> tuple[Seats, ...]: ...  # each replica's slots, held and health

    def set_healthy(self, replica: str, healthy: bool) -> None: ...  # in or out of capacity

    # For new admissions; `replicas`: each replica's slots (a group of one by default);
    # a new one in `unready` joins out of service until `set_healthy` (its health check).
    def resize(self, capacity: int, queue_limit: int,
               replicas: Mapping[str, int] | None = None,
               unready: Collection[str] = ()) -> None: ...


Clock = Callable[[], float]
FORECAST_TTL_S = 0.25
