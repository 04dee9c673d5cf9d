"""Reading a request body: its declared size, the process-wide bound on body bytes held in
memory, and the read deadline.

A body counts against the bound from before it is read (its declared Content-Length, or
chunk by chunk when it has none) until its request ends: the parsed form stays with the
request while it queues and is forwarded. Beyond the bound the request is refused at
once (503 + Retry-After), before more of it is read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from policies.config import ServerConfig
from router.openai_api import ApiError, read_body


class InflightBodies:
    """The bytes of request bodies the process holds now."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = 0


class BodyHold:
    """One request's share of `InflightBodies`; `release` gives it back (in a finally)."""

    __slots__ = ("bodies", "limit", "size")

    def __init__(self, bodies: InflightBodies, limit: int) -> None:
        self.bodies, self.limit, self.size = bodies, limit, 0

    def take(self, size: int) -> bool:
        bodies = self.bodies
        if bodies.held + size > self.limit:
            return False
        bodies.held += size
        self.size += size
        return True

    def release(self) -> None:
        self.bodies.held -= self.size
        self.size = 0


async def read_held(request: web.BaseRequest, server: ServerConfig, hold: BodyHold,
                    busy: Callable[[], ApiError]) -> bytes:
    """The body, counted in `hold`: 413 beyond `max_body_bytes`, `busy()` beyond the bound
    on bytes held, 408 if it has not all come within `body_read_timeout_s`."""

    def charge(size: int) -> None:
        if not hold.take(size):
            raise busy()

    declared = request.content_length
    if declared is not None and declared <= server.max_body_bytes:
        charge(declared)  # all of it, before a byte is read
    each = charge if declared is None else None
    if request.content.is_eof():  # it all came with the headers: no wait, no timer
        return await read_body(request, server.max_body_bytes, each)
    try:
        async with asyncio.timeout(server.body_read_timeout_s):
            return await read_body(request, server.max_body_bytes, each)
    except TimeoutError:
        _close_when_answered(request)
        raise ApiError(408, f"The request body did not arrive within "
                       f"{server.body_read_timeout_s:g} s.", code="request_timeout",
                       close=True) from None


def _close_when_answered(request: web.BaseRequest) -> None:
    """Close the connection as soon as this request's answer is written.

    aiohttp would otherwise keep reading the unread rest of the body for up to 10 s
    (its lingering close) before closing, and a client that waits for the connection to
    end would get its answer that late. The handler's task ends once aiohttp has written
    the answer; closing the transport then flushes it first. A stalled client has sent
    nothing more, so the close is a FIN, not a reset."""
    transport, task = request.transport, asyncio.current_task()
    if transport is not None and task is not None:
        task.add_done_callback(lambda _: transport.close())
