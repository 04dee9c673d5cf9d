"""Deadlines that do not count the event loop's own stalls.

Under a burst one turn of the loop can take longer than a Redis call's timeout: a reply
that came in time is read late, and a plain timeout would call Redis slow. `StallClock`
ticks every `TICK_S` and adds up how late its ticks ran; `deadline()` is an
`asyncio.timeout` whose budget is spent only while the loop was responsive, up to a cap.
The gateway runs one for its process (its stalls are `slotgate_event_loop_stall_seconds`,
through `on_stall`) and lends it to the Redis coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

TICK_S = 0.02  # how often the loop's lateness is sampled
SLACK_S = 0.005  # lateness below this is scheduling noise, not a stall


class StallClock:
    """How long the event loop has been stalled in all (seconds), sampled every tick."""

    def __init__(self, on_stall: Callable[[float], None] | None = None) -> None:
        self.stalled_s = 0.0
        self.on_stall = on_stall  # told each stall's length (lateness past SLACK_S)
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due = 0.0

    def start(self) -> None:
        if self._handle is not None:
            return  # started by its owner already
        loop = self._loop = asyncio.get_running_loop()
        self._due = loop.time() + TICK_S
        self._handle = loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        loop = self._loop  # (not get_running_loop(), which makes a getpid() system call)
        assert loop is not None  # set by start, before the first tick
        now = loop.time()
        late = now - self._due
        if late > SLACK_S:
            self.stalled_s += late
            if self.on_stall is not None:
                self.on_stall(late)
        self._due = now + TICK_S
        self._handle = loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    @contextlib.asynccontextmanager
    async def deadline(self, budget_s: float, cap_s: float) -> AsyncIterator[None]:
        """Raise TimeoutError once `budget_s` of responsive time has passed (or `cap_s`
        of wall time, whatever the loop did)."""
        loop = asyncio.get_running_loop()
        start, stalled = loop.time(), self.stalled_s
        async with asyncio.timeout(None) as timeout:
            handle: list[asyncio.TimerHandle] = []

            def check() -> None:
                now = loop.time()
                due = start + budget_s + (self.stalled_s - stalled)
                if now < due and now < start + cap_s:  # the loop stalled meanwhile
                    handle[0] = loop.call_at(min(due, start + cap_s), check)
                else:
                    timeout.reschedule(now)  # expires now

            handle.append(loop.call_at(start + budget_s, check))
            try:
                yield
            finally:
                handle[0].cancel()
