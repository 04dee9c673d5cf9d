"""Batch lines give their slot back: the handlers of the batch lines holding a slot, per
pool, so that an interactive request that would wait there cancels one instead (the
newest: it has done the least). Its slot goes to the oldest waiter in one hand-off, its
engine request is aborted as for a client that left, and the batch runner sees the cut
and runs the line again; nothing of the cut answer was written."""

from __future__ import annotations

import asyncio


class RunningLines:
    def __init__(self) -> None:
        self._by_pool: dict[str, list[asyncio.Task[object]]] = {}
        self.preempted = 0  # in all, since the process started

    def hold(self, pool: str, task: asyncio.Task[object]) -> None:
        """`task`, a batch line's handler, holds a slot of `pool` until it ends."""
        held = self._by_pool.setdefault(pool, [])
        held.append(task)
        task.add_done_callback(lambda done: held.remove(done) if done in held else None)

    def count(self, pool: str) -> int:
        """Batch lines holding a slot of `pool` now."""
        return len(self._by_pool.get(pool, ()))

    def preempt(self, pool: str) -> bool:
        """Cancel the newest batch line holding a slot of `pool`; whether there was one."""
        held = self._by_pool.get(pool)
        while held:
            task = held.pop()
            if not task.done():
                task.cancel()
                self.preempted += 1
                return True
        return False
