"""Waiting without polling for a condition that changes at known moments."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Changes:
    """Whoever changes the watched state calls `changed()`; waiters re-check then."""

    def __init__(self) -> None:
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []

    def changed(self) -> None:
        for predicate, fut in self._waiters:
            if not fut.done() and predicate():
                fut.set_result(None)

    async def wait_until(self, predicate: Callable[[], bool], within_s: float) -> None:
        if predicate():
            return
        waiter = (predicate, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(within_s):
                await waiter[1]
        finally:
            self._waiters.remove(waiter)
