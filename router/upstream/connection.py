"""One keep-alive HTTP/1.1 connection to an engine: an asyncio.Protocol driving httptools
(llhttp), its body buffer with backpressure, and the deadlines the pool's ticker checks."""

from __future__ import annotations

import asyncio
import math
import select
from typing import Protocol, cast

from httptools import HttpParserError, HttpParserUpgrade, HttpResponseParser
from multidict import CIMultiDict

from router.upstream.errors import (
    BadResponse,
    ResponseDropped,
    ResponseTimeout,
    StaleBytes,
    UpstreamError,
)
from router.upstream.wire import Origin, until_close

MAX_HEAD_BYTES = 64 * 1024  # status line + header fields (interim 1xx answers included)
MAX_HEADER_FIELDS = 128
PAUSE_AT = 256 * 1024  # body bytes buffered unread before the engine is made to wait


class Keeper(Protocol):
    """The pool a connection goes back to (router.upstream.client.HttpPool)."""

    def _checkin(self, conn: Connection) -> None: ...

    def _forget(self, conn: Connection) -> None: ...


class _Surplus(Exception):
    """Raised in the parser when a second message begins: the answer has ended."""


class Connection(asyncio.Protocol):
    """One keep-alive connection: the parser's callbacks, the body buffer, the waiters."""

    __slots__ = (
        "answered", "body", "body_waiter", "buffered", "done", "error", "first_byte_by",
        "head_bytes", "head_done", "head_only", "head_raw", "head_waiter", "headers", "idle",
        "idle_s", "idle_since", "interim", "last_data", "loop", "lost", "origin", "parser",
        "paused", "poller", "pool", "raw_headers", "received", "reusable", "reused", "sent",
        "status", "transport", "until_close",
    )
    transport: asyncio.Transport
    headers: CIMultiDict[str]
    head_waiter: asyncio.Future[None] | None  # request() waits for the final headers
    body_waiter: asyncio.Future[None] | None  # readany() waits for body bytes

    def __init__(self, pool: Keeper, origin: Origin, loop: asyncio.AbstractEventLoop) -> None:
        self.pool, self.origin, self.loop = pool, origin, loop
        self.parser = HttpResponseParser(self)
        self.idle = self.lost = self.paused = False
        self.idle_since = 0.0
        self.body: list[bytes] = []
        self.buffered = 0
        self.head_waiter = self.body_waiter = None
        self.poller: select.poll | None = None  # made at the first reuse
        self.reused = False  # it carried an exchange before this one
        self._start(False, math.inf, math.inf)

    def _start(self, head_only: bool, first_byte_s: float, idle_s: float) -> None:
        self.head_only = head_only
        self.last_data = self.loop.time()
        self.first_byte_by, self.idle_s = self.last_data + first_byte_s, idle_s
        self.answered = False
        self.received = self.head_done = self.done = self.interim = self.until_close = False
        self.reusable = True  # until something rules it out
        self.error: UpstreamError | None = None
        self.raw_headers: list[tuple[str, str]] = []
        self.head_bytes = self.head_raw = self.status = 0
        self.sent = False  # the whole request has left our buffer (for the kernel)

    async def exchange(self, data: bytes, head_only: bool, first_byte_s: float,
                       idle_s: float) -> None:
        """Send one request; return once the final response's headers are in."""
        self._start(head_only, first_byte_s, idle_s)
        if self.lost:
            raise ResponseDropped("the connection closed before the request was sent")
        waiter = self.head_waiter = self.loop.create_future()
        self.transport.write(data)
        self.sent = not self.transport.get_write_buffer_size()  # at once, but for big bodies
        try:
            await waiter
        except (UpstreamError, asyncio.CancelledError):
            self.transport.abort()  # failed or cancelled: this connection's state is unknown
            raise
        finally:
            self.head_waiter = None

    def take(self) -> bytes:
        body = self.body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self.buffered = 0
        if self.paused:
            self.paused = False
            self.last_data = self.loop.time()  # the engine waited on us, not we on it
            self.transport.resume_reading()
        return data

    def expired(self, now: float) -> ResponseTimeout | None:
        """The deadline this exchange has passed, if any (checked by the pool's ticker)."""
        if self.done or self.paused:
            return None
        if not self.answered:
            if now > self.first_byte_by:
                return ResponseTimeout("no first byte in time", first_byte=True)
        elif now - self.last_data > self.idle_s:
            return ResponseTimeout("the answer went idle", first_byte=False)
        return None

    def _fail(self, error: UpstreamError) -> None:
        self.error = self.error or error
        self.reusable = False
        self.transport.abort()
        self._wake()

    def _wake(self) -> None:
        head = self.head_waiter
        if head is not None and not head.done():
            if self.head_done:
                head.set_result(None)
            elif self.error is not None:
                head.set_exception(self.error)
        body = self.body_waiter
        if body is not None and not body.done() and (self.body or self.done or self.error):
            body.set_result(None)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.idle or self.done or self.error is not None:
            self.reusable = False  # unsolicited, or after the end of the answer
            if self.idle:
                self.transport.abort()
            return
        if not self.sent and self._early():
            return
        self.received = True
        self.last_data = self.loop.time()
        try:
            self.parser.feed_data(data)
        except (HttpParserError, HttpParserUpgrade) as exc:
            if self.done:  # junk after a complete answer: the answer stands, not the connection
                self.reusable = False
            else:
                cause = exc.__context__
                self._fail(cause if isinstance(cause, BadResponse) else
                           BadResponse(f"invalid HTTP response: {exc}"))
                return
        if not self.head_done:
            self.head_raw += len(data)  # bounds a header line that never ends
            if self.head_raw > MAX_HEAD_BYTES:
                self._fail(BadResponse(f"response headers exceed {MAX_HEAD_BYTES} bytes"))
                return
        elif self.buffered > PAUSE_AT and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def _early(self) -> bool:
        """Bytes before the whole request was written: no answer to it can have begun.
        The connection is not kept; on a reused one they may be left from the exchange
        before, so the request fails (unsent, safe to send again on a new connection),
        while on a new one they are an early answer (a 413 before the body): it stands."""
        self.sent = not self.transport.get_write_buffer_size()
        if self.sent:
            return False
        self.reusable = False
        if self.reused:
            self._fail(StaleBytes("bytes from the engine before the request was written"))
            return True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reusable = False
        if self.idle:
            self.pool._forget(self)
            return
        if not self.done and self.error is None:
            if self.head_done and self.until_close and exc is None:
                self.done = True  # a body without length ends with the connection
            else:
                where = "mid-body" if self.head_done else "before the response headers"
                self.error = ResponseDropped(f"connection lost {where}: {exc or 'closed'}")
        self._wake()

    def on_message_begin(self) -> None:
        if self.done:  # bytes after the answer: never part of it (stops the parser)
            raise _Surplus("bytes after the end of the response")

    def on_status(self, status: bytes) -> None:
        self.head_bytes += len(status) + 15

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value) + 4
        raw = self.raw_headers
        raw.append((name.decode("latin-1"), value.decode("latin-1")))
        if len(raw) > MAX_HEADER_FIELDS or self.head_bytes > MAX_HEAD_BYTES:
            raise BadResponse(f"response headers exceed {MAX_HEADER_FIELDS} fields "
                              f"or {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # informational (a stray 100 Continue): the answer follows
            self.interim = True
            self.raw_headers = []
            return
        self.status = status
        self.headers = CIMultiDict(self.raw_headers)
        self.head_done = True
        if self.head_only:
            self.done = True  # no body, whatever the headers say; not reusable then
            self.reusable = False
        else:
            self.until_close = until_close(status, self.headers)

    def on_body(self, body: bytes) -> None:
        self.answered = True
        self.body.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
        elif not self.done:
            self.done = True
            if not self.parser.should_keep_alive():
                self.reusable = False

