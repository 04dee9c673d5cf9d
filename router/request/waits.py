"""How a queued handler stops waiting for a slot: cut short by a drain or a failing
backend (`Interrupt`), or given up while a slot may be on its way (`abandon`)."""

from __future__ import annotations

import asyncio
from typing import Any

from policies.slots import Lease


async def abandon(waiting: asyncio.Future[Lease]) -> None:
    """Stop waiting for a slot; a wait that already finished holds a lease: release it."""
    if not waiting.done():
        waiting.cancel()
        await asyncio.wait({waiting})  # raises only a cancellation of the caller's own
    if waiting.done() and not waiting.cancelled() and waiting.exception() is None:
        await waiting.result().release()


class Interrupt:
    """Cancels a waiting handler's task when draining starts or its backend fails. `why`
    is empty while waiting; then "done", or what cut the wait short (a signal whose
    callback was already scheduled when the wait ended must not cancel what follows)."""

    __slots__ = ("task", "why")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task, self.why = task, ""

    def draining(self, _: asyncio.Future[None]) -> None:
        self._cut("draining")

    def opened(self, _: asyncio.Future[None]) -> None:
        self._cut("opened")

    def _cut(self, reason: str) -> None:
        if not self.why:
            self.why = reason
            self.task.cancel()
