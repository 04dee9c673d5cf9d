"""A lean keep-alive HTTP/1.1 client for the upstream leg (gateway -> engine).

aiohttp's ClientSession costs ~8x the CPU per request of an asyncio.Protocol driving
httptools (llhttp), and every admitted request crosses this leg once. This is just enough
client for it: a LIFO keep-alive pool per origin, bodies streamed with backpressure, and
first-byte and idle deadlines kept by one coarse ticker per pool rather than a timer per
request. Errors: UpstreamError > ConnectFailed | ResponseTimeout | ResponseDropped >
BadResponse.
"""

from __future__ import annotations

import asyncio
import math
import select
import ssl
from collections import defaultdict, deque
from collections.abc import Iterable
from typing import cast

from httptools import HttpParserError, HttpParserUpgrade, HttpResponseParser
from multidict import CIMultiDict

from router.upstream.wire import BODYLESS, Origin, Target, encode, until_close

MAX_HEAD_BYTES = 64 * 1024  # status line + header fields (interim 1xx answers included)
MAX_HEADER_FIELDS = 128
PAUSE_AT = 256 * 1024  # body bytes buffered unread before the engine is made to wait


class UpstreamError(Exception):
    """The upstream exchange failed."""


class ConnectFailed(UpstreamError):
    """No connection could be opened (`timeout`: the connect timeout passed)."""

    def __init__(self, message: str, *, timeout: bool) -> None:
        super().__init__(message)
        self.timeout = timeout


class ResponseDropped(UpstreamError):
    """The connection was lost after the request was sent, before the response ended."""


class BadResponse(ResponseDropped):
    """The engine's bytes are not valid HTTP/1.1, or its headers exceed the limits."""


class ResponseTimeout(UpstreamError):
    """No body byte within the first-byte timeout (`first_byte`), or a gap in the body
    longer than the idle timeout. The connection is closed: the engine aborts."""

    def __init__(self, message: str, *, first_byte: bool) -> None:
        super().__init__(message)
        self.first_byte = first_byte


class _Surplus(Exception):
    """Raised in the parser when a second message begins: the answer has ended."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection: the parser's callbacks, the body buffer, the waiters."""

    __slots__ = (
        "answered", "body", "body_waiter", "buffered", "done", "error", "first_byte_by",
        "head_bytes", "head_done", "head_only", "head_raw", "head_waiter", "headers", "idle",
        "idle_s", "idle_since", "interim", "last_data", "loop", "lost", "origin", "parser",
        "paused", "poller", "pool", "raw_headers", "received", "reusable", "status", "transport",
        "until_close",
    )
    transport: asyncio.Transport
    headers: CIMultiDict[str]
    head_waiter: asyncio.Future[None] | None  # request() waits for the final headers
    body_waiter: asyncio.Future[None] | None  # readany() waits for body bytes

    def __init__(self, pool: HttpPool, origin: Origin, loop: asyncio.AbstractEventLoop) -> None:
        self.pool, self.origin, self.loop = pool, origin, loop
        self.parser = HttpResponseParser(self)
        self.idle = self.lost = self.paused = False
        self.idle_since = 0.0
        self.body: list[bytes] = []
        self.buffered = 0
        self.head_waiter = self.body_waiter = None
        self.poller: select.poll | None = None  # made at the first reuse
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

    async def exchange(self, data: bytes, head_only: bool, first_byte_s: float,
                       idle_s: float) -> None:
        """Send one request; return once the final response's headers are in."""
        self._start(head_only, first_byte_s, idle_s)
        if self.lost:
            raise ResponseDropped("the connection closed before the request was sent")
        waiter = self.head_waiter = self.loop.create_future()
        self.transport.write(data)
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


class Response:
    """The engine's answer: status and headers now, the body as it arrives."""

    __slots__ = ("_conn", "_eof", "headers", "status")

    def __init__(self, conn: _Connection) -> None:
        self._conn: _Connection | None = conn
        self._eof = False
        self.status, self.headers = conn.status, conn.headers

    async def readany(self) -> bytes:
        """The next body bytes available; b"" once the body has ended."""
        conn = self._conn
        if conn is None:
            if self._eof:
                return b""
            raise ResponseDropped("the response was closed")
        while not conn.body:
            if conn.done:
                return b""
            if conn.error is not None:
                raise conn.error
            waiter = conn.body_waiter = conn.loop.create_future()
            try:
                await waiter
            except asyncio.CancelledError:
                conn.reusable = False
                raise
            finally:
                conn.body_waiter = None
        return conn.take()

    def is_eof(self) -> bool:
        conn = self._conn
        return self._eof if conn is None else conn.done and not conn.body

    async def read(self, limit: int) -> bytes:
        """Up to `limit` bytes of the body (until its end or the limit)."""
        parts: list[bytes] = []
        size = 0
        while size < limit and (chunk := await self.readany()):
            parts.append(chunk)
            size += len(chunk)
        data = b"".join(parts)
        if size > limit and self._conn is not None:  # the rest stays for the next read
            self._conn.body.insert(0, data[limit:])
            self._conn.buffered += size - limit
            data = data[:limit]
        return data

    def release(self) -> None:
        """Done with the answer: the connection goes back to the pool when it can."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            self._eof = conn.done and not conn.body
            if self._eof and conn.reusable:
                conn.pool._checkin(conn)
            else:
                conn.transport.abort()

    def close(self) -> None:
        """Close the connection now: the engine learns the client left."""
        if self._conn is not None:
            self._conn.reusable = False
        self.release()


class HttpPool:
    """Keep-alive HTTP/1.1 connections to any origins, idle ones kept per (tls, host, port)."""

    def __init__(self, *, max_idle_per_origin: int = 256, idle_ttl_s: float = 4.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.max_idle_per_origin = max_idle_per_origin  # may change (a reload's new slots)
        self._ttl = idle_ttl_s
        self._ssl = ssl_context
        self._idle: defaultdict[Origin, deque[_Connection]] = defaultdict(deque)
        self._closed = False
        self.connections_opened = 0
        self._active: set[_Connection] = set()  # exchanges with deadlines, for the ticker
        self._tick_s = 1.0  # a tenth of the shortest timeout seen (deadlines run <= 10% late)
        self._ticker: asyncio.TimerHandle | None = None

    def idle_count(self, target: Target) -> int:
        stack = self._idle.get(target.origin)
        return len(stack) if stack else 0

    async def request(self, method: str, target: Target, headers: Iterable[tuple[str, str]],
                      body: bytes, *, connect_timeout_s: float,
                      first_byte_timeout_s: float = math.inf,
                      idle_timeout_s: float = math.inf) -> Response:
        """Send a request; return once the response's headers are in (before the body).
        The first byte of the body must come within `first_byte_timeout_s` of sending,
        and no gap in it may last `idle_timeout_s` (the time the reader makes the engine
        wait does not count). Raises ValueError (bad method or header), ConnectFailed,
        ResponseTimeout, ResponseDropped, here or from the response's reads."""
        timing = (first_byte_timeout_s, idle_timeout_s)
        if self._closed:
            raise RuntimeError("HttpPool is closed")
        data = encode(method, target, headers, body)
        head_only = method == "HEAD"
        conn = self._checkout(target.origin)
        if conn is not None:
            try:
                return await self._exchange(conn, data, head_only, timing)
            except ResponseDropped:
                if conn.received or method not in BODYLESS:
                    raise
                # The engine closed this idle connection as we wrote, or failed: a GET is
                # sent once more, on a new connection. Never a POST: the engine may have
                # begun to generate (an idle connection closed by the engine leaves the
                # pool at once, and idle_ttl_s stays under engines' keep-alive timeouts).
        conn = await self._connect(target, connect_timeout_s)
        return await self._exchange(conn, data, head_only, timing)

    async def _exchange(self, conn: _Connection, data: bytes, head_only: bool,
                        timing: tuple[float, float]) -> Response:
        first_byte_s, idle_s = timing
        if first_byte_s < math.inf or idle_s < math.inf:
            self._active.add(conn)
            self._tick_s = max(0.01, min(self._tick_s, first_byte_s / 10, idle_s / 10))
            if self._ticker is None:
                self._ticker = conn.loop.call_later(self._tick_s, self._tick)
        await conn.exchange(data, head_only, first_byte_s, idle_s)
        return Response(conn)

    def _tick(self) -> None:
        """Fail the exchanges past a deadline; forget those that ended."""
        now = asyncio.get_running_loop().time()
        for conn in list(self._active):
            if conn.done or conn.error is not None or conn.lost or conn.idle:
                self._active.discard(conn)
            elif (late := conn.expired(now)) is not None:
                self._active.discard(conn)
                conn._fail(late)
        self._ticker = (asyncio.get_running_loop().call_later(self._tick_s, self._tick)
                        if self._active else None)

    async def close(self) -> None:
        """Close the idle connections; the pool takes no more requests."""
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        idle, self._idle = self._idle, defaultdict(deque)
        for stack in idle.values():
            for conn in stack:
                conn.transport.abort()
        await asyncio.sleep(0)  # lets the transports finish closing their sockets

    async def _connect(self, target: Target, timeout_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        ctx = None
        if target.tls:
            ctx = self._ssl = self._ssl or ssl.create_default_context()
        conn = _Connection(self, target.origin, loop)
        where = f"{target.host}:{target.port}"
        try:
            async with asyncio.timeout(timeout_s):
                await loop.create_connection(lambda: conn, target.host, target.port, ssl=ctx,
                                             server_hostname=target.host if ctx else None)
        except TimeoutError as exc:  # before OSError, of which it is a subclass
            raise ConnectFailed(f"connect to {where} timed out", timeout=True) from exc
        except (OSError, UnicodeError) as exc:  # refused, unreachable, DNS, IDNA, TLS
            raise ConnectFailed(f"connect to {where} failed: {exc}", timeout=False) from exc
        self.connections_opened += 1
        return conn

    def _checkout(self, origin: Origin) -> _Connection | None:
        stack = self._idle.get(origin)
        if not stack:
            return None
        now = asyncio.get_running_loop().time()
        while stack:  # LIFO: once one is too old, so are all those under it
            conn = stack.pop()
            conn.idle = False
            if (now - conn.idle_since < self._ttl and not conn.transport.is_closing()
                    and not _unread(conn)):
                return conn
            conn.transport.abort()
        return None

    def _checkin(self, conn: _Connection) -> None:
        if self._closed or self.max_idle_per_origin <= 0 or conn.transport.is_closing():
            conn.transport.abort()
            return
        stack = self._idle[conn.origin]
        now = conn.loop.time()
        # The bottom is the longest idle: closed here, as LIFO checkouts may never reach it.
        limit = self.max_idle_per_origin
        while stack and (len(stack) >= limit or now - stack[0].idle_since >= self._ttl):
            stack.popleft().transport.abort()
        conn.idle = True
        conn.idle_since = now
        stack.append(conn)

    def _forget(self, conn: _Connection) -> None:  # an idle connection was closed
        stack = self._idle.get(conn.origin)
        if stack is not None and conn in stack:
            stack.remove(conn)


def _unread(conn: _Connection) -> bool:
    """Has the engine sent anything (bytes, or its close) on this idle connection that the
    loop has not read yet? An unsolicited answer must never pass for the next request's:
    one zero-timeout poll per reuse closes the gap between the loop's last poll and this
    checkout (what arrives after the request is written cannot be told apart)."""
    poller = conn.poller
    if poller is None:
        sock = conn.transport.get_extra_info("socket")
        if sock is None:
            return False
        poller = conn.poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))
