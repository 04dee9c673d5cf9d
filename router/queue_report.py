"""What a queued stream hears while it waits: its place in line and its expected wait."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from policies.slots import SlotPool, Ticket
from router.sse import queue_frame


async def report_queue(response: web.StreamResponse, ticket: Ticket, pool: SlotPool,
                       events: bool, every_s: float) -> None:
    """Tell a waiting stream where it stands: at once, whenever its position changes or
    its ETA moves by more than a fifth (and 1 s), and at least every `every_s`.

    Driven by the pool's move signal (one future shared by all waiters, resolved only
    when places may have moved, not at each arrival behind): no polling. `events` picks
    `slotgate.queue` events over SSE comments (docs/QUEUE_EVENTS.md).
    """
    sent_position, sent_eta, sent_at = 0, 0.0, 0.0
    try:
        while True:
            position, now = ticket.position, time.perf_counter()
            if position == 0:
                return  # granted (or gone): the waiter says so itself
            eta = ticket.eta_s()
            if (position != sent_position or now - sent_at >= every_s
                    or abs(eta - sent_eta) > max(1.0, 0.2 * sent_eta)):
                await response.write(queue_frame(position, eta, pool.name, events))
                sent_position, sent_eta, sent_at = position, eta, now
            await asyncio.wait({pool.next_move()}, timeout=max(0.0, sent_at + every_s - now))
    except ConnectionResetError:
        return  # the client left; its handler is being cancelled
