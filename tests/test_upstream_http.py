"""The upstream HTTP/1.1 client against real servers on loopback: aiohttp for well-behaved
engines, raw asyncio servers for misbehaving ones. No sleeps: servers and tests meet on
events and queues."""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

import pytest
import trustme
from aiohttp import web

from router.upstream.client import HttpPool
from router.upstream.connection import PAUSE_AT
from router.upstream.errors import BadResponse, ConnectFailed, ResponseDropped, ResponseTimeout
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


@pytest.fixture
async def raw() -> AsyncIterator[Raw]:
    raw = Raw()
    yield raw
    for task in raw.tasks:
        task.cancel()
    await asyncio.gather(*raw.tasks, return_exceptions=True)
    for server in raw.servers:
        server.close()
        await server.wait_closed()


@pytest.fixture
async def pool() -> AsyncIterator[HttpPool]:
    pool = HttpPool()
    yield pool
    await pool.close()


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


def test_target_parse() -> None:
    t = Target.parse("http://Engine.local:8000/v1/chat/completions?x=1#frag")
    assert (t.tls, t.host, t.port, t.path, t.host_header) == (
        False, "engine.local", 8000, "/v1/chat/completions?x=1", "engine.local:8000")
    t = Target.parse("https://[::1]")
    assert (t.tls, t.port, t.path, t.host_header) == (True, 443, "/", "[::1]")
    assert Target.parse("http://h:80/").host_header == "h"
    for bad in ("ftp://h/", "http:///x", "http://u:p@h/", "http://h/a b", "http://h/\r\nX: y",
                "http://h:99999/", "http://h:0/", "http://h/\x00", "//h/x", "http://[::1/"):
        with pytest.raises(ValueError):
            Target.parse(bad)


async def test_content_length_answer_and_reuse(aiohttp_server: Any, pool: HttpPool) -> None:
    peers = set()

    async def echo(request: web.Request) -> web.Response:
        peers.add(request.transport.get_extra_info("peername"))  # type: ignore[union-attr]
        return web.Response(body=b"echo:" + await request.read(), headers={"X-Engine": "yes"})

    app = web.Application()
    app.router.add_post("/v1/x", echo)
    target = await app_target(aiohttp_server, app)
    for n in range(3):
        resp = await post(pool, target, b"hi%d" % n)
        assert resp.status == 200 and resp.headers["x-engine"] == "yes"
        assert await resp.read(2) == b"ec" and not resp.is_eof()  # the rest is kept
        assert await resp.read(1000) == b"ho:hi%d" % n and resp.is_eof()
        resp.release()
        resp.release()  # idempotent
    assert pool.connections_opened == 1 and len(peers) == 1 and pool.idle_count(target) == 1
    sock = pool._idle[target.origin][0].transport.get_extra_info("socket")
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    resp = await post(pool, target)
    assert await within(resp.read(100)) == b"echo:{}" and resp.is_eof()
    resp.close()  # even with the answer whole: the connection goes, not back to the pool
    assert pool.idle_count(target) == 0 and pool.connections_opened == 1


async def test_chunked_stream_in_order(aiohttp_server: Any, pool: HttpPool) -> None:
    gates: asyncio.Queue[None] = asyncio.Queue()  # one get() per pause of the engine

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(b"data: one\n\n")
        await gates.get()
        for part in (b"data: two\n\n", b"data: three\n\n"):
            await resp.write(part)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/x", stream)
    target = await app_target(aiohttp_server, app)
    resp = await post(pool, target)
    assert resp.headers["Transfer-Encoding"] == "chunked"
    first = b""
    while len(first) < 11:
        first += await within(resp.readany())
    assert first == b"data: one\n\n" and not resp.is_eof()
    gates.put_nowait(None)
    rest = b""
    while chunk := await within(resp.readany()):
        rest += chunk
    assert rest == b"data: two\n\ndata: three\n\n" and resp.is_eof()
    assert await resp.readany() == b""
    resp.release()
    gates.put_nowait(None)
    assert await fetch(pool, target) == b"data: one\n\ndata: two\n\ndata: three\n\n"
    assert pool.connections_opened == 1 and pool.idle_count(target) == 1
    # A readany cancelled mid-body: whatever follows, that connection is not reused.
    resp = await post(pool, target)
    assert pool.idle_count(target) == 0
    assert await within(resp.readany()) == b"data: one\n\n"
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0):  # cancels readany once it waits
            await resp.readany()
    gates.put_nowait(None)
    assert await within(resp.read(1000)) == b"data: two\n\ndata: three\n\n"
    resp.release()
    assert pool.idle_count(target) == 0


@pytest.mark.parametrize("head", [b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n",
                                  b"HTTP/1.1 200 OK\r\n\r\n"])
async def test_body_until_close(raw: Raw, pool: HttpPool, head: bytes) -> None:
    target = await raw.serve(head + b"hello world", linger=False)
    for _ in range(2):
        assert await fetch(pool, target) == b"hello world"
        assert pool.idle_count(target) == 0
    assert pool.connections_opened == 2 == len(raw.writers)


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
    OK + b"HTTP/1.1 200 OK\r\n",  # more than was asked for
])
async def test_not_reused_after(raw: Raw, pool: HttpPool, answer: bytes) -> None:
    target = await raw.serve(answer)
    assert await fetch(pool, target) == b"ok"
    assert pool.idle_count(target) == 0
    assert await within(raw.left.get()) in ("eof", "reset")


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial",
    CHUNKED + b"7\r\npartial\r\n",
])
async def test_dropped_mid_body(raw: Raw, pool: HttpPool, answer: bytes) -> None:
    resp = await post(pool, await raw.serve(answer, linger=False))
    assert await within(resp.readany()) == b"partial"
    with pytest.raises(ResponseDropped) as info:
        await within(resp.read(1000))
    assert type(info.value) is ResponseDropped and not resp.is_eof()
    resp.release()


def fields(n: int) -> bytes:
    return b"".join(b"X-%d: v\r\n" % i for i in range(n))


@pytest.mark.parametrize(("answer", "count"), [
    (b"HTTP/1.1 100 Continue\r\nX-A: 1\r\n\r\n" + OK, 1),  # the interim answer is skipped
    (b"HTTP/1.1 200 OK\r\n" + fields(127) + b"Content-Length: 2\r\n\r\nok", 128),  # the limit
])
async def test_unusual_valid_answers(raw: Raw, pool: HttpPool, answer: bytes, count: int) -> None:
    target = await raw.serve(answer, answer)
    for _ in range(2):
        resp = await post(pool, target)
        assert resp.status == 200 and len(resp.headers) == count and "X-A" not in resp.headers
        assert await within(resp.read(10)) == b"ok"
        resp.release()
    assert len(raw.writers) == 1


@pytest.mark.parametrize("answer", [
    b"SPAM SPAM SPAM\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (65 * 1024) + b"\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (300 * 1024),  # a header line that never ends
    b"HTTP/1.1 200 OK\r\n" + fields(128) + b"Content-Length: 2\r\n\r\nok",  # 129 fields
    b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: x\r\n\r\n",
])
async def test_bad_response(raw: Raw, pool: HttpPool, answer: bytes) -> None:
    with pytest.raises(BadResponse):
        await post(pool, await raw.serve(answer))
    assert await within(raw.left.get()) in ("eof", "reset") and pool.connections_opened == 1


async def test_connect_refused_and_timeout(pool: HttpPool) -> None:
    with socket.socket() as closed:  # bound, not listening: the kernel refuses
        closed.bind(("127.0.0.1", 0))
        target = Target.parse(f"http://127.0.0.1:{closed.getsockname()[1]}/")
        with pytest.raises(ConnectFailed) as info:
            await post(pool, target)
        assert info.value.timeout is False
    with socket.socket() as full, socket.socket() as first:
        full.bind(("127.0.0.1", 0))
        full.listen(0)  # one connection fills its queue: the kernel drops further SYNs
        first.connect(full.getsockname())
        target = Target.parse(f"http://127.0.0.1:{full.getsockname()[1]}/")
        with pytest.raises(ConnectFailed) as info:
            await pool.request("GET", target, [], b"", connect_timeout_s=0.05)
        assert info.value.timeout is True
    assert pool.connections_opened == 0


async def get(pool: HttpPool, target: Target) -> bytes:
    resp = await within(pool.request("GET", target, [], b"", connect_timeout_s=5))
    body: bytes = await within(resp.read(1 << 20))
    resp.release()
    return body


async def test_stale_keepalive_get_retried_once(raw: Raw, pool: HttpPool) -> None:
    target = await raw.serve(OK)  # then meets the next request on that connection by closing
    assert await get(pool, target) == b"ok"
    assert await get(pool, target) == b"ok"
    assert await within(raw.left.get()) == "data"  # the first connection saw the second request
    assert pool.connections_opened == len(raw.writers) == 2 and len(raw.requests) == 2


async def test_stale_keepalive_post_never_retried(raw: Raw, pool: HttpPool) -> None:
    """A POST may have started a generation: it is never sent twice."""
    target = await raw.serve(OK)
    assert await fetch(pool, target) == b"ok"
    with pytest.raises(ResponseDropped):
        await post(pool, target)
    assert await within(raw.left.get()) == "data"
    assert pool.connections_opened == len(raw.writers) == 1 and len(raw.requests) == 1


@pytest.mark.parametrize("answers", [
    (OK, b"HTTP/1.1 2"),  # a response byte came on the reused connection
    (None,),  # a fresh connection, reset
    (b"HTTP/1.1 200 OK\r\nContent-",),  # a fresh connection, dropped mid-headers
])
async def test_never_retried_otherwise(raw: Raw, pool: HttpPool, answers: tuple[Any]) -> None:
    target = await raw.serve(*answers, linger=False)
    if len(answers) == 2:
        assert await fetch(pool, target) == b"ok"
    with pytest.raises(ResponseDropped) as info:
        await post(pool, target)
    assert type(info.value) is ResponseDropped and len(raw.requests) == len(answers)
    assert pool.connections_opened == len(raw.writers) == 1


async def test_close_mid_stream_tells_the_engine(raw: Raw, pool: HttpPool) -> None:
    target = await raw.serve(CHUNKED + b"5\r\nhello\r\n")
    resp = await post(pool, target)
    assert await within(resp.readany()) == b"hello"
    resp.close()
    resp.close()  # idempotent
    assert await within(raw.left.get()) in ("eof", "reset")
    assert pool.idle_count(target) == 0


async def test_backpressure_reaches_the_engine(raw: Raw, pool: HttpPool) -> None:
    size = 64 * 1024 * 1024  # more than the kernel's socket buffers hold
    resp = await post(pool, await raw.serve(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                                            % (size, bytes(size))))
    conn, engine = resp._conn, raw.writers[0].transport
    paused = asyncio.Event()
    pause = conn.transport.pause_reading
    conn.transport.pause_reading = lambda: (paused.set(), pause())  # type: ignore[func-returns-value]
    if not conn.paused:  # it may have paused already, before request() returned
        await within(paused.wait())
    assert not conn.transport.is_reading()
    assert conn.buffered <= PAUSE_AT + 256 * 1024  # one socket read past the mark at most
    assert engine.get_write_buffer_size() > 0  # the engine is held up, not buffered for
    total = largest = 0
    while chunk := await within(resp.readany()):
        total += len(chunk)
        largest = max(largest, len(chunk))
    assert total == size and largest <= PAUSE_AT + 256 * 1024
    resp.release()


async def test_header_injection_and_reserved_headers(raw: Raw, pool: HttpPool) -> None:
    target = await raw.serve(OK, OK)
    for bad in [("X-Evil", "a\r\nInjected: 1"), ("X-Evil", "a\nb"), ("X-Evil", "a\0"),
                ("X Evil", "a"), ("X-Evil:", "a"), ("", "a"), ("X-\u00e9", "a")]:
        with pytest.raises(ValueError):
            await pool.request("POST", target, [bad], b"{}", connect_timeout_s=5)
    with pytest.raises(ValueError):
        await pool.request("GET /x HTTP/1.1\r\n", target, [], b"", connect_timeout_s=5)
    assert pool.connections_opened == 0 and len(raw.writers) == 0
    given = [("Host", "evil"), ("content-length", "99"), ("Transfer-Encoding", "chunked"),
             ("Connection", "close"), ("X-Name", "caf\udcc3\udca9")]  # as aiohttp's server has it
    (await within(pool.request("POST", target, given, b"{}", connect_timeout_s=5))).release()
    (await within(pool.request("GET", target, [], b"", connect_timeout_s=5))).release()
    host = target.host_header.encode()
    assert raw.requests == [
        b"POST /v1/x HTTP/1.1\r\nHost: %s\r\nContent-Length: 2\r\nX-Name: caf\xc3\xa9\r\n\r\n{}"
        % host, b"GET /v1/x HTTP/1.1\r\nHost: %s\r\n\r\n" % host]


async def test_https_with_a_private_ca(aiohttp_server: Any) -> None:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    app = web.Application()
    app.router.add_post("/v1/x", answer("secure"))
    target = await app_target(aiohttp_server, app, ssl=server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    trusting, default = HttpPool(ssl_context=client_ctx), HttpPool()
    try:
        assert [await fetch(trusting, target) for _ in range(2)] == [b"secure"] * 2
        assert trusting.connections_opened == 1
        with pytest.raises(ConnectFailed) as info:
            await post(default, target)
        assert info.value.timeout is False
        assert isinstance(info.value.__cause__, ssl.SSLCertVerificationError)
    finally:
        await trusting.close()
        await default.close()


async def test_idle_ttl_and_close(aiohttp_server: Any) -> None:
    app = web.Application()
    app.router.add_post("/v1/x", answer("ok"))
    target = await app_target(aiohttp_server, app)
    pool = HttpPool(idle_ttl_s=0)
    for _ in range(2):
        assert await fetch(pool, target) == b"ok"
        assert pool.idle_count(target) == 1  # kept, then too old at the next checkout
    assert pool.connections_opened == 2
    await pool.close()
    assert pool.idle_count(target) == 0
    with pytest.raises(RuntimeError):
        await post(pool, target)


async def test_head_has_no_body(aiohttp_server: Any, pool: HttpPool) -> None:
    app = web.Application()
    app.router.add_get("/v1/x", answer("hello"))
    target = await app_target(aiohttp_server, app)
    resp = await within(pool.request("HEAD", target, [], b"", connect_timeout_s=5))
    assert resp.status == 200 and resp.headers["Content-Length"] == "5"
    assert await within(resp.read(100)) == b"" and resp.is_eof()
    resp.release()
    assert pool.idle_count(target) == 0  # the parser still counts on a body: not reused


async def test_max_idle_and_unsolicited_bytes(raw: Raw) -> None:
    target = await raw.serve(OK)
    pool = HttpPool(max_idle_per_origin=1)
    first, second = await post(pool, target), await post(pool, target)
    for resp in (first, second):
        assert await within(resp.read(10)) == b"ok"
        resp.release()
    assert await within(raw.left.get()) == "eof"  # over the limit: the longest idle is closed
    assert pool.connections_opened == 2 and pool.idle_count(target) == 1
    raw.writers[1].write(b"HTTP/1.1 200 OK\r\n")  # to the idle connection, unasked
    assert await within(raw.left.get()) in ("eof", "reset")
    assert pool.idle_count(target) == 0
    await pool.close()


async def test_cancelled_request_closes_the_connection(raw: Raw, pool: HttpPool) -> None:
    target = await raw.serve(b"")  # reads the request, never answers
    task = asyncio.create_task(pool.request("POST", target, [], b"{}", connect_timeout_s=5))
    await within(raw.arrived.wait())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await within(raw.left.get()) in ("eof", "reset") and pool.idle_count(target) == 0


async def test_first_byte_and_idle_deadlines(raw: Raw, pool: HttpPool) -> None:
    """Kept by the pool's ticker: the engine is cut off (it sees the connection close)."""
    timing = {"connect_timeout_s": 5, "first_byte_timeout_s": 0.05, "idle_timeout_s": 0.05}
    target = await raw.serve(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")  # then silence
    resp = await within(pool.request("POST", target, [], b"{}", **timing))
    with pytest.raises(ResponseTimeout) as info:
        await within(resp.readany())
    assert info.value.first_byte and await within(raw.left.get()) in ("eof", "reset")
    target = await raw.serve(CHUNKED + b"5\r\nhello\r\n")  # one chunk, then silence
    resp = await within(pool.request("POST", target, [], b"{}", **timing))
    assert await within(resp.readany()) == b"hello"
    with pytest.raises(ResponseTimeout) as info:
        await within(resp.readany())
    assert not info.value.first_byte and await within(raw.left.get()) in ("eof", "reset")
    resp.close()
