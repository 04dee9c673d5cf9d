"""A streamed answer's chunks on their way to the client.

aiohttp's writer costs a chunk three coroutine frames and a dozen calls (the response's
checks, the writer's, its chunk framing, its write accounting). Once it has sent the
answer's head, a relayed chunk needs only its framing and one write to the client's
socket, so `put` does that while the client keeps up. Everything else goes through
aiohttp's writer (`write`): the head and the first chunk (coalesced, as aiohttp does),
an HTTP/1.0 client's unframed body, a transport closing, and a write that would take the
client's buffer past its high-water mark, which waits at most `limit_s` for the client
to read (then it counts as gone: a client that stops reading must not hold the slot).
aiohttp's own end (`write_eof`) writes the last chunk's marker as ever.

The fast write reads four facts of aiohttp's writer (aiohttp is pinned to 3.14): the head
is written, the body is chunked, neither compressed nor cut to a declared length, and no
one listens to its chunks; `tests/test_client_stream.py` checks them on a real server.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.http_writer import StreamWriter


class ClientGone(Exception):
    """The downstream client closed its connection."""


class ClientStream:
    """Writes to one prepared streamed response."""

    __slots__ = ("_high", "_limit_s", "_response", "_transport", "_writer")

    def __init__(self, response: web.StreamResponse, transport: asyncio.Transport | None,
                 limit_s: float) -> None:
        self._response = response
        self._transport = transport
        self._high = transport.get_write_buffer_limits()[1] if transport is not None else 0
        self._limit_s = limit_s
        self._writer: StreamWriter | None = None  # aiohttp's, once it may be bypassed

    def put(self, data: bytes) -> bool:
        """Write `data` now, framed as a chunk, if aiohttp has sent the head and the
        client keeps up; False: nothing written, the caller awaits `write`."""
        writer, transport = self._writer, self._transport
        if (writer is None or transport is None or transport.is_closing()
                or transport.get_write_buffer_size() + len(data) > self._high):
            return False
        transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        writer.output_size += len(data)
        return True

    async def write(self, data: bytes) -> None:
        """Write `data` through aiohttp's writer; a wait for a client that does not read
        lasts at most `limit_s`. Raises ClientGone."""
        transport = self._transport
        try:
            if transport is not None and (transport.get_write_buffer_size() + len(data)
                                          > self._high):
                async with asyncio.timeout(self._limit_s):
                    await self._response.write(data)
            else:
                await self._response.write(data)
        except (ConnectionResetError, TimeoutError):
            raise ClientGone from None
        if self._writer is None:
            self._writer = _bypassable(self._response)


def _bypassable(response: web.StreamResponse) -> StreamWriter | None:
    """aiohttp's writer of `response`, if a chunk may be written past it."""
    writer = response._payload_writer  # (private: aiohttp 3.14)
    if (isinstance(writer, StreamWriter) and writer._headers_written and writer.chunked
            and writer._compress is None and writer.length is None
            and writer._on_chunk_sent is None and writer.on_body_write is None):
        return writer
    return None
