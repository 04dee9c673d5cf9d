"""Move offers: waiters of one queue that would also take a slot on another pool.

A simple request queued for the primary registers an offer on a fallback pool; the
moment that pool has a free slot and no waiters of its own, the oldest offer is
granted a lease there. No polling: the pool's change notification drives it. A local
pool is asked synchronously; a shared (Redis) pool by one task at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict

from policies.slots.base import CoordinationError, Lease, PoolUnavailable, SlotPool
from policies.slots.local import LocalSlotPool


class MoveOffers:
    """Offers for one pool's free slots, served oldest first, after the pool's own queue."""

    def __init__(self, pool: SlotPool) -> None:
        self.pool = pool
        self._offers: OrderedDict[asyncio.Future[Lease], None] = OrderedDict()
        self._granting = False
        self._task: asyncio.Task[None] | None = None
        self._releases: set[asyncio.Future[None]] = set()
        pool.watch(self._on_change)

    def __len__(self) -> int:
        return len(self._offers)

    def offer(self) -> asyncio.Future[Lease]:
        future: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        self._offers[future] = None
        self._grant()  # a slot may be free already
        return future

    def withdraw(self, future: asyncio.Future[Lease]) -> None:
        """Forget the offer; a lease granted to it and not taken goes back to the pool."""
        self._offers.pop(future, None)
        if future.done() and not future.cancelled():
            lease = future.result()
            if isinstance(self.pool, LocalSlotPool):
                lease.release_now()  # type: ignore[attr-defined]
            else:
                task = asyncio.ensure_future(lease.release())
                self._releases.add(task)
                task.add_done_callback(self._releases.discard)
        else:
            future.cancel()

    def _on_change(self, _: object) -> None:
        if self._offers and not self._granting:
            self._grant()

    def _grant(self) -> None:
        if not isinstance(self.pool, LocalSlotPool):
            if self._task is None or self._task.done():
                self._task = asyncio.ensure_future(self._grant_shared())
            return
        self._granting = True  # acquiring below notifies watchers, including us
        try:
            while self._offers:
                future = self._oldest()
                if future is None:
                    return
                lease = self.pool.acquire_nowait()
                if lease is None:
                    return
                del self._offers[future]
                future.set_result(lease)
        finally:
            self._granting = False

    async def _grant_shared(self) -> None:
        while self._offers:
            if self._oldest() is None:
                return
            with contextlib.suppress(CoordinationError, PoolUnavailable):  # not taken, then
                lease = await self.pool.try_acquire()
                if lease is None:
                    return
                future = self._oldest()
                if future is None:
                    await lease.release()
                    return
                del self._offers[future]
                future.set_result(lease)
                continue
            return

    def _oldest(self) -> asyncio.Future[Lease] | None:
        while self._offers:
            future = next(iter(self._offers))
            if not future.done():
                return future
            del self._offers[future]
        return None
