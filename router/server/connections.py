"""Connection-level limits, kept on the connection and never per request: caps on open
connections (in all and per client address), a deadline and a size bound on each request
head. `ConnectionGuard` is one per server; `router.server.runner._Handler` calls it.

One coarse ticker serves every head deadline (no timer per connection or per request):
the heads awaited are kept in a dict in the order they began, which is the order of their
deadlines, so a tick looks only at the ones that expired, and the oldest is the one a full
house evicts. The same ticker probes half-closed clients still waiting for their answer.
"""

from __future__ import annotations

import asyncio
import ipaddress
import resource
from collections.abc import Callable
from http import HTTPStatus
from typing import Protocol

from policies.config import ServerConfig
from policies.scheduler.admission import RejectReason
from router.common.errors import ApiError
from router.request.access_log import LogSampler
from router.request.rejections import answer

# File descriptors kept for what is not a client: the listening socket, Redis, the ledger's
# database, log files, health probes, DNS. Engine connections are counted apart (per slot).
_FD_RESERVE = 64


class Awaited(Protocol):
    """A connection whose request head is awaited, or whose half-closed client is probed."""

    def head_expired(self) -> None: ...

    def probe(self) -> bool:
        """Probe the client once; False when no more probes are wanted."""
        ...

    def evict(self) -> bool:
        """Close the connection if no answer is under way on it; whether it was."""
        ...


def raw_response(error: ApiError) -> bytes:
    """`error` as a complete HTTP/1.1 answer that closes the connection, written straight
    to a transport where no request exists to answer through aiohttp."""
    body = error.response().body
    assert isinstance(body, bytes)
    head = [f"HTTP/1.1 {error.status} {HTTPStatus(error.status).phrase}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Connection: close"]
    head += [f"{name}: {value}" for name, value in error.headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def fd_budget(engine_slots: int) -> int:
    """Client connections this process can hold under its open-file limit: the soft
    RLIMIT_NOFILE less a fixed reserve and two descriptors per engine slot (one in use, one
    idle in the upstream pool). At least 16, so a tiny limit still serves someone."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1_000_000
    return max(16, soft - _FD_RESERVE - 2 * engine_slots)


class ConnectionGuard:
    def __init__(self, server: ServerConfig, fd_limit: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # The clock of every head deadline and age: the loop's, replaceable (to age heads
        # without waiting for them).
        self.clock: Callable[[], float] = loop.time
        self.head_timeout = server.head_timeout_s
        self.max_head_bytes = server.max_head_bytes
        self.max_connections = min(server.max_connections, fd_limit)
        self.max_per_client = server.max_connections_per_client
        # A trusted proxy speaks for many clients: the per-address cap is not for it.
        self._proxies = tuple(ipaddress.ip_network(n) for n in server.trusted_proxies)
        self._proxy_seen: dict[str, bool] = {}
        self.header_limit = server.max_header_bytes
        self.open = 0
        self.per_client: dict[str, int] = {}
        self._heads: dict[Awaited, float] = {}  # insertion order is deadline order
        self._probed: set[Awaited] = set()  # half-closed clients awaiting their answer
        self._tick = min(1.0, self.head_timeout / 4)  # how late a deadline may fire
        self._ticker: asyncio.TimerHandle | None = None
        full = RejectReason.CONNECTIONS  # a head's deadline from now, a socket may be free
        self.busy = raw_response(answer(server, full, self.head_timeout))
        self.busy_client = raw_response(answer(
            server, full, self.head_timeout, "Too many open connections from this address; "
            "retry shortly."))
        self.head_timed_out = raw_response(ApiError(
            408, f"The request head was not received within {self.head_timeout:g} s.",
            code="request_timeout"))
        self.unrouted = LogSampler()  # the access lines of unparsable methods: 1 a second
        self.head_too_large = raw_response(ApiError(
            431, f"The request head is larger than {self.max_head_bytes} bytes.",
            code="request_header_fields_too_large"))

    def admit(self, client: str) -> bytes | None:
        """Count a new connection from `client`, or the answer that refuses it."""
        held = self.per_client.get(client, 0)
        if held >= self.max_per_client and not self._is_proxy(client):
            return self.busy_client
        if self.open >= self.max_connections and not self._evict_stalled():
            return self.busy
        self.open += 1
        self.per_client[client] = held + 1
        return None

    def _is_proxy(self, client: str) -> bool:
        """Is `client` one of `server.trusted_proxies`? (Asked only at the cap.)"""
        if not self._proxies:
            return False
        known = self._proxy_seen.get(client)
        if known is None:
            try:
                address = ipaddress.ip_address(client.split("%", 1)[0])
            except ValueError:
                known = False
            else:
                known = any(address in network for network in self._proxies)
            if len(self._proxy_seen) >= 4096:
                self._proxy_seen.clear()
            self._proxy_seen[client] = known
        return known

    def release(self, client: str) -> None:
        self.open -= 1
        held = self.per_client.pop(client) - 1
        if held:
            self.per_client[client] = held

    def _evict_stalled(self) -> bool:
        """Close the connection that has waited longest for its request head, if that is
        more than a tick: when every place is taken by slow heads, a newcomer still gets in
        (and it sends its head at once, so it is the last to be evicted in turn)."""
        started_before = self.clock() - self._tick + self.head_timeout
        victim = None
        for scanned, (conn, deadline) in enumerate(self._heads.items()):
            if deadline > started_before or scanned == 8:  # bounded: admit stays O(1)
                return False
            if conn.evict():
                victim = conn
                break
        if victim is None:
            return False
        del self._heads[victim]
        return True

    def head_started(self, conn: Awaited) -> None:
        heads = self._heads
        heads.pop(conn, None)  # re-entered at the end: the order stays the deadlines'
        heads[conn] = self.clock() + self.head_timeout
        if self._ticker is None:
            self._ticker = self._loop.call_later(self._tick, self._expire)

    def head_done(self, conn: Awaited) -> None:
        self._heads.pop(conn, None)

    def probe_each_tick(self, conn: Awaited) -> None:
        self._probed.add(conn)
        if self._ticker is None:
            self._ticker = self._loop.call_later(self._tick, self._expire)

    def probe_done(self, conn: Awaited) -> None:
        self._probed.discard(conn)

    @property
    def heads_awaited(self) -> int:
        return len(self._heads)

    def _expire(self) -> None:
        loop = self._loop
        now = self.clock()
        expired = []
        for conn, deadline in self._heads.items():
            if deadline > now:
                break
            expired.append(conn)
        for conn in expired:
            del self._heads[conn]
            conn.head_expired()
        for conn in [conn for conn in self._probed if not conn.probe()]:
            self._probed.discard(conn)
        busy = self._heads or self._probed
        self._ticker = loop.call_later(self._tick, self._expire) if busy else None

    def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self._heads.clear()
        self._probed.clear()
