"""A lean keep-alive HTTP/1.1 client for the upstream leg (gateway -> engine).

aiohttp's ClientSession costs ~8x the CPU per request of an asyncio.Protocol driving
httptools (llhttp), and every admitted request crosses this leg once. This is just enough
client for it: a LIFO keep-alive pool per origin, bodies streamed with backpressure, and
first-byte and idle deadlines kept by one coarse ticker per pool rather than a timer per
request. One connection and its parser: router.upstream.connection; the answer read
from it: router.upstream.response; the errors: router.upstream.errors.
"""

from __future__ import annotations

import asyncio
import math
import select
import ssl
from collections import defaultdict, deque
from collections.abc import Iterable

from router.upstream.connection import Connection
from router.upstream.errors import (
    ConnectFailed,
    ResponseDropped,
    StaleBytes,
)
from router.upstream.response import Response
from router.upstream.wire import BODYLESS, Origin, Target, encode


class HttpPool:
    """Keep-alive HTTP/1.1 connections to any origins, idle ones kept per (tls, host, port)."""

    def __init__(self, *, max_idle_per_origin: int = 256, idle_ttl_s: float = 4.0,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.max_idle_per_origin = max_idle_per_origin  # may change (a reload's new slots)
        self._ttl = idle_ttl_s
        self._ssl = ssl_context
        self._idle: defaultdict[Origin, deque[Connection]] = defaultdict(deque)
        self._closed = False
        self.connections_opened = 0
        self._active: set[Connection] = set()  # exchanges with deadlines, for the ticker
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
                self._watch(conn, timing)  # (no coroutine of its own: the chain stays short)
                await conn.exchange(data, head_only, *timing)
                return Response(conn)
            except StaleBytes:
                pass  # the request never reached the engine whole: sent again, once
            except ResponseDropped:
                if conn.received or method not in BODYLESS:
                    raise
                # The engine closed this idle connection as we wrote, or failed: a GET is
                # sent once more, on a new connection. Never a POST: the engine may have
                # begun to generate (an idle connection closed by the engine leaves the
                # pool at once, and idle_ttl_s stays under engines' keep-alive timeouts).
        conn = await self._connect(target, connect_timeout_s)
        self._watch(conn, timing)
        await conn.exchange(data, head_only, *timing)
        return Response(conn)

    def _watch(self, conn: Connection, timing: tuple[float, float]) -> None:
        """The exchange's deadlines, kept by the pool's ticker."""
        first_byte_s, idle_s = timing
        if first_byte_s < math.inf or idle_s < math.inf:
            self._active.add(conn)
            self._tick_s = max(0.01, min(self._tick_s, first_byte_s / 10, idle_s / 10))
            if self._ticker is None:
                self._ticker = conn.loop.call_later(self._tick_s, self._tick)

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

    async def _connect(self, target: Target, timeout_s: float) -> Connection:
        loop = asyncio.get_running_loop()
        ctx = None
        if target.tls:
            ctx = self._ssl = self._ssl or ssl.create_default_context()
        conn = Connection(self, target.origin, loop)
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

    def _checkout(self, origin: Origin) -> Connection | None:
        stack = self._idle.get(origin)
        if not stack:
            return None
        # (its loop's clock: asyncio.get_running_loop() makes a getpid() system call)
        now = stack[-1].loop.time()
        while stack:  # LIFO: once one is too old, so are all those under it
            conn = stack.pop()
            conn.idle = False
            conn.reused = True
            if (now - conn.idle_since < self._ttl and not conn.transport.is_closing()
                    and not _unread(conn)):
                return conn
            conn.transport.abort()
        return None

    def _checkin(self, conn: Connection) -> None:
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

    def _forget(self, conn: Connection) -> None:  # an idle connection was closed
        stack = self._idle.get(conn.origin)
        if stack is not None and conn in stack:
            stack.remove(conn)


def _unread(conn: Connection) -> bool:
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
