"""The engine's answer as the proxy reads it: status and headers, then the body as it
arrives, the connection going back to its pool once the body has been read to its end."""

from __future__ import annotations

import asyncio

from router.upstream.connection import Connection
from router.upstream.errors import ResponseDropped


class Response:
    """The engine's answer: status and headers now, the body as it arrives."""

    __slots__ = ("_conn", "_eof", "headers", "status")

    def __init__(self, conn: Connection) -> None:
        self._conn: Connection | None = conn
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
