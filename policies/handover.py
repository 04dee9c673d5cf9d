"""Move offers: waiters of one queue that would also take a slot on another pool.

A simple request queued for the primary registers an offer on a fallback pool; the
moment that pool has a free slot and no waiters of its own, the oldest offer is
granted a lease there. No polling: the pool's change notification drives it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from policies.slots import LocalLease, LocalSlotPool


class MoveOffers:
    """Offers for one pool's free slots, served oldest first, after the pool's own queue."""

    def __init__(self, pool: LocalSlotPool) -> None:
        self.pool = pool
        self._offers: OrderedDict[asyncio.Future[LocalLease], None] = OrderedDict()
        self._granting = False
        pool.watch(self._on_change)

    def __len__(self) -> int:
        return len(self._offers)

    def offer(self) -> asyncio.Future[LocalLease]:
        future: asyncio.Future[LocalLease] = asyncio.get_running_loop().create_future()
        self._offers[future] = None
        self._grant()  # a slot may be free already
        return future

    def withdraw(self, future: asyncio.Future[LocalLease]) -> None:
        """Forget the offer; a lease granted to it and not taken goes back to the pool."""
        self._offers.pop(future, None)
        if future.done() and not future.cancelled():
            future.result().release_now()
        else:
            future.cancel()

    def _on_change(self, _: LocalSlotPool) -> None:
        if self._offers and not self._granting:
            self._grant()

    def _grant(self) -> None:
        self._granting = True  # acquiring below notifies watchers, including us
        try:
            while self._offers:
                future = next(iter(self._offers))
                if future.done():
                    del self._offers[future]
                    continue
                lease = self.pool.acquire_nowait()
                if lease is None:
                    return
                del self._offers[future]
                future.set_result(lease)
        finally:
            self._granting = False
