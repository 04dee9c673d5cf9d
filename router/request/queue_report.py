"""What a queued stream hears while it waits: its place in line and its expected wait.

One `QueueReporter` per pool tells every waiting stream of that pool, from one task, rather
than a task per waiter: thousands may queue, and a task with its timer and wait set costs
about 3 KiB each. The reporter is driven by the pool's move signal (resolved only when
places may have moved, not at each arrival behind) and by the earliest heartbeat due: no
polling. It runs while anyone listens, and ends when the last listener leaves.
"""

from __future__ import annotations

import asyncio
import math
import time

from aiohttp import web

from policies.slots import SlotPool, Ticket
from router.apis.dialect import OPENAI, Dialect


class _Listener:
    __slots__ = ("dialect", "events", "every_s", "response", "sent_at", "sent_eta", "sent_position",
                 "ticket", "transport")

    def __init__(self, transport: asyncio.Transport, response: web.StreamResponse, ticket: Ticket,
                 events: bool, every_s: float, dialect: Dialect) -> None:
        self.transport, self.response, self.ticket = transport, response, ticket
        self.dialect = dialect
        self.events, self.every_s = events, every_s
        self.sent_position, self.sent_eta, self.sent_at = 0, 0.0, 0.0

    def frame(self, pool: str, now: float) -> bytes | None:
        """The report due now, if any: at once, whenever the position changes or the ETA
        moves by more than a fifth (and 1 s), and at least every `every_s`."""
        position = self.ticket.position
        if position == 0:
            return None  # granted (or gone): the waiter says so itself
        eta = self.ticket.eta_s()
        # A heartbeat may go up to half a period early: then one wake serves every listener
        # due within the next half period (listeners arrive spread out in time).
        if (position == self.sent_position and now - self.sent_at < self.every_s / 2
                and abs(eta - self.sent_eta) <= max(1.0, 0.2 * self.sent_eta)):
            return None
        self.sent_position, self.sent_eta, self.sent_at = position, eta, now
        return self.dialect.queue_frame(position, eta, pool, self.events)


class QueueReporter:
    """Queue reports for every waiting stream of one pool."""

    def __init__(self, pool: SlotPool) -> None:
        self.pool = pool
        self._listeners: dict[Ticket, _Listener] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake_at = math.inf  # when the running task next looks, unless a move comes
        self._kick: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._listeners)

    async def listen(self, request: web.BaseRequest, response: web.StreamResponse,
                     ticket: Ticket, events: bool, every_s: float,
                     dialect: Dialect = OPENAI) -> None:
        """Tell `ticket`'s stream where it stands now, then whenever that changes, until
        `leave`. Raises ConnectionResetError if the client is already gone."""
        if request.transport is None:
            raise ConnectionResetError("the client is gone")
        listener = _Listener(request.transport, response, ticket, events, every_s, dialect)
        first = listener.frame(self.pool.name, time.perf_counter())
        if first is not None:
            await response.write(first)
        self._listeners[ticket] = listener
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        elif listener.sent_at + every_s < self._wake_at:  # sooner than the task will look
            self._wake()

    def leave(self, ticket: Ticket) -> None:
        """No more reports for `ticket` (granted, gone or refused): from here on, only its
        own handler writes to its stream."""
        self._listeners.pop(ticket, None)
        if not self._listeners:
            self._wake()  # the task ends rather than wait out a heartbeat for nobody

    def _wake(self) -> None:
        if self._kick is not None and not self._kick.done():
            self._kick.set_result(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._listeners:
            now = time.perf_counter()
            due = math.inf
            for ticket, listener in list(self._listeners.items()):
                if ticket in self._listeners and await self._tell(ticket, listener, now):
                    due = min(due, listener.sent_at + listener.every_s)
            if not self._listeners:
                break
            self._kick = loop.create_future()
            self._wake_at = due
            await asyncio.wait({self.pool.next_move(), self._kick},
                               timeout=max(0.0, due - time.perf_counter()),
                               return_when=asyncio.FIRST_COMPLETED)
        self._wake_at, self._kick = math.inf, None

    async def _tell(self, ticket: Ticket, listener: _Listener, now: float) -> bool:
        """Send `listener` its report if one is due; False once it is gone from the list."""
        transport = listener.transport
        if transport.is_closing():
            self._listeners.pop(ticket, None)  # the client left; its handler is cancelled
            return False
        if transport.get_write_buffer_size():
            return True  # not reading: skip it, so that one slow reader never holds the rest
        frame = listener.frame(self.pool.name, now)
        if frame is None:
            return True
        try:
            # An empty write buffer: this completes without suspending (no drain), so no
            # other listener waits on it, and it cannot follow its handler's own writes.
            await listener.response.write(frame)
        except ConnectionResetError:
            self._listeners.pop(ticket, None)
            return False
        return True
