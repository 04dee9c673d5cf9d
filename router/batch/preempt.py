"""Batch lines give their slot back: the handlers of the batch lines holding a slot, per
pool, so that an interactive request that would wait there cancels one instead (the
newest: it has done the least). Its slot goes to the oldest waiter in one hand-off, its
engine request is aborted as for a client that left, and the batch runner sees the cut
and runs the line again; nothing of the cut answer was written."""

from __future__ import annotations

import asyncio

from policies.slots.base import Lease


class RunningLines:
    def __init__(self) -> None:
        # A line's handler and its lease: the handler runs in its connection's task, which
        # serves the connection's next request too, so an entry counts until its lease is
        # released, not until the task ends.
        self._by_pool: dict[str, list[tuple[asyncio.Task[object], Lease]]] = {}
        self.preempted = 0  # in all, since the process started
        self.preempted_by_pool: dict[str, int] = {}

    def hold(self, pool: str, task: asyncio.Task[object], lease: Lease) -> None:
        """`task`, a batch line's handler, holds `lease`, a slot of `pool`."""
        self._by_pool.setdefault(pool, []).append((task, lease))

    def _live(self, pool: str) -> list[tuple[asyncio.Task[object], Lease]]:
        held = [entry for entry in self._by_pool.get(pool, ()) if not entry[1].released]
        self._by_pool[pool] = held
        return held

    def pools(self) -> list[str]:
        return list(self._by_pool)

    def count(self, pool: str) -> int:
        """Batch lines holding a slot of `pool` now, uncut: slots an interactive request
        may have (the scheduler sees them as free to it: `router.candidates`)."""
        return len(self._live(pool)) if pool in self._by_pool else 0

    def preempt(self, pool: str) -> bool:
        """Cancel the newest batch line holding a slot of `pool`; whether there was one."""
        held = self._live(pool) if pool in self._by_pool else None
        while held:
            task, _ = held.pop()
            if not task.done():
                task.cancel()
                self.preempted += 1
                self.preempted_by_pool[pool] = self.preempted_by_pool.get(pool, 0) + 1
                return True
        return False
