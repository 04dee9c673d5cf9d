"""The upstream client's pool against real servers on loopback: connecting, keep-alive
reuse and its one retry, backpressure, TLS, idle connections, cancellation and deadlines.
No sleeps: servers and tests meet on events and queues."""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any

import pytest
import trustme
from aiohttp import web

from router.upstream.client import HttpPool
from router.upstream.connection import PAUSE_AT
from router.upstream.errors import ConnectFailed, ResponseDropped, ResponseTimeout
from router.upstream.wire import Target
from tests.support.engines import CHUNKED, OK, Raw, answer, app_target, fetch, get, post, within


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
