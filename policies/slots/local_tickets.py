"""What a `LocalSlotPool` hands out: leases (held slots) and tickets (places in line).

The pool (`policies.slots.local`) owns their state; these are its handles. No I/O.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from policies.clock.forecast import Progress
from policies.slots.base import Clock, QueueTimeout, Share
from policies.slots.deadlines import Deadlines


class Charges(Protocol):
    """A fair line's counters, as a lease tells them its answer's tokens."""

    def charged(self, lease: LocalLease, output_tokens: int) -> None: ...


class Owner(Protocol):
    """What a lease and a ticket ask of their pool (`policies.slots.local`), named here
    so that this module need not import it."""

    @property
    def name(self) -> str: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def _forecasts(self) -> dict[int, float]: ...

    @property
    def _fair(self) -> Charges | None: ...

    def forecast(self, position: int) -> float: ...

    def _position(self, ticket: LocalTicket) -> int: ...

    def _leave(self, ticket: LocalTicket) -> None: ...

    def _release(self, lease: LocalLease) -> None: ...

    @property
    def deadlines(self) -> Deadlines: ...


class LocalLease:
    __slots__ = ("_granted_at", "_pool", "progress", "released", "replica")

    def __init__(self, pool: Owner, granted_at: float, replica: str,
                 max_tokens: int | None = None) -> None:
        self._pool = pool
        self._granted_at = granted_at
        self.replica = replica
        self.released = False
        self.progress = Progress(max_tokens)  # what the forecast reads of its answer

    @property
    def pool(self) -> str:
        return self._pool.name

    @property
    def held_s(self) -> float:
        return self._pool.clock() - self._granted_at

    def lost(self) -> None:
        return None  # a local slot cannot be taken away

    def follow(self, progress: Progress) -> None:
        self.progress = progress
        self._pool._forecasts.clear()  # the remainder it implies differs from a guess

    def charge(self, output_tokens: int) -> None:
        fair = self._pool._fair
        if fair is not None:  # (a fifo line charges no one)
            fair.charged(self, output_tokens)

    async def release(self) -> None:
        self.release_now()

    def release_now(self) -> None:
        if not self.released:
            self.released = True
            self._pool._release(self)


class LocalTicket:
    __slots__ = ("_claimed", "_future", "_pool", "bypassed", "enqueued_at", "max_tokens",
                 "pin", "rank", "seq", "share", "timed", "want")

    def __init__(self, pool: Owner, future: asyncio.Future[LocalLease],
                 rank: int, want: str | None = None, max_tokens: int | None = None,
                 share: Share | None = None) -> None:
        self._pool = pool
        self._future = future
        self._claimed = False
        self.rank = rank
        self.seq = 0  # its place in its class's line (set by Line.append)
        self.enqueued_at = pool.clock()
        self.want = want  # the replica it would rather run on (its prompt's prefix is there)
        self.bypassed = 0  # waiters behind it served first (the look-ahead)
        self.max_tokens = max_tokens  # its request's cap: how long it will hold its slot
        self.share = share  # its tenant, for a `fair` line (kept in either order: a reload
        # may switch the line's order while it waits)
        # While set, it takes a slot on `want` alone (the scheduler found waiting for the
        # replica that holds its prefix sooner than a cold prefill elsewhere); the timer
        # that ends its patience (the pool's `_unpin`).
        self.pin: asyncio.TimerHandle | None = None
        self.timed = False  # its deadline counts in the pool's `deadlines`

    @property
    def position(self) -> int:
        return self._pool._position(self)

    async def wait(self, timeout_s: float) -> LocalLease:
        # The deadline resolves the ticket's own future (the pool's one timer for all its
        # waiters, no timeout context per waiter): whichever comes first, a slot or the
        # deadline, is the outcome.
        deadlines = self._pool.deadlines
        deadlines.add(self, timeout_s)
        try:
            lease = await self._future
        except BaseException:
            self.withdraw_now()  # timed out, shed, or cancelled (the client is gone)
            raise
        finally:
            deadlines.left(self)
        self._claimed = True
        return lease

    def _expire(self) -> None:
        if not self._future.done():
            self._future.set_exception(QueueTimeout())

    async def withdraw(self) -> None:
        self.withdraw_now()

    def eta_s(self) -> float:
        position = self.position
        return self._pool.forecast(position) if position > 0 else 0.0

    def withdraw_now(self) -> None:
        self._pool._leave(self)
        granted = self._granted()
        if granted is not None and not self._claimed:
            self._claimed = True
            granted.release_now()  # handed over meanwhile: pass it on to the next waiter

    def _granted(self) -> LocalLease | None:
        fut = self._future
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            return fut.result()
        return None
