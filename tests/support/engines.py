"""Engines for the upstream client's tests (tests/test_upstream_*.py): raw asyncio servers
that answer with given bytes, aiohttp apps for well-behaved ones, and bounded requests."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from aiohttp import web

from router.upstream.client import HttpPool
from router.upstream.wire import Target

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
within = partial(asyncio.wait_for, timeout=5)  # every wait is bounded: fail, never hang


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One whole request (head and Content-Length body), or b"" once the client left."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.lower().split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        return head + await reader.readexactly(length)
    except (asyncio.IncompleteReadError, ConnectionError):
        return b""


async def hangup(reader: asyncio.StreamReader) -> str:
    """How the client left: "eof", "reset", or "data" when it sent more instead."""
    try:
        return "eof" if await reader.read(1) == b"" else "data"
    except ConnectionResetError:
        return "reset"


class Raw:
    """A raw engine: each connection answers its requests with `answers` in turn (None:
    reset the connection), then lingers until the client leaves (reported in `left`) or,
    with linger=False, closes."""

    def __init__(self) -> None:
        self.servers: list[asyncio.Server] = []
        self.tasks: set[asyncio.Task[Any]] = set()
        self.writers: list[asyncio.StreamWriter] = []
        self.requests: list[bytes] = []
        self.arrived = asyncio.Event()
        self.left: asyncio.Queue[str] = asyncio.Queue()

    async def serve(self, *answers: bytes | None, linger: bool = True) -> Target:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.writers.append(writer)
            self.tasks.add(asyncio.current_task())  # type: ignore[arg-type]
            try:
                for answer in answers:
                    if not (request := await read_request(reader)):
                        break
                    self.requests.append(request)
                    self.arrived.set()
                    if answer is None:
                        linger_0 = struct.pack("ii", 1, 0)  # close with a RST
                        writer.get_extra_info("socket").setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, linger_0)
                        writer.transport.abort()
                        return
                    writer.write(answer)
                if linger:
                    self.left.put_nowait(await hangup(reader))
            finally:
                writer.close()

        server = await asyncio.start_server(run, "127.0.0.1", 0)
        self.servers.append(server)
        return Target.parse(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/x")


def post(pool: HttpPool, target: Target, body: bytes = b"{}") -> Awaitable[Any]:
    return within(pool.request("POST", target, [], body, connect_timeout_s=5))


async def fetch(pool: HttpPool, target: Target) -> bytes:
    """POST, read the whole answer, release."""
    resp = await post(pool, target)
    body: bytes = await within(resp.read(1 << 20))
    assert resp.is_eof()
    resp.release()
    return body


def answer(text: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=text)
    return handler


async def app_target(aiohttp_server: Any, app: web.Application, **kwargs: Any) -> Target:
    server = await aiohttp_server(app, **kwargs)
    return Target.parse(f"{server.scheme}://127.0.0.1:{server.port}/v1/x")


async def get(pool: HttpPool, target: Target) -> bytes:
    resp = await within(pool.request("GET", target, [], b"", connect_timeout_s=5))
    body: bytes = await within(resp.read(1 << 20))
    resp.release()
    return body


def rate_limited(hits: list[int]) -> web.Application:
    """An engine that answers every chat completion 429 with `Retry-After: 30`, counting
    each in `hits`."""

    async def saturated(request: web.Request) -> web.Response:
        hits.append(1)
        return web.json_response({"error": {"message": "too many", "type": "rate_limit_error",
                                            "code": "rate_limit_exceeded"}},
                                 status=429, headers={"Retry-After": "30"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", saturated)
    return app

