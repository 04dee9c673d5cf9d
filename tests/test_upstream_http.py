"""The upstream HTTP/1.1 client reading answers from real servers on loopback: aiohttp for
well-behaved engines, raw asyncio servers for misbehaving ones (framing, bad responses, what
ends reuse). The pool's connections, retries and deadlines: tests/test_upstream_pool.py.
No sleeps: servers and tests meet on events and queues."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from aiohttp import web

from router.upstream.client import HttpPool
from router.upstream.errors import BadResponse, ResponseDropped
from router.upstream.wire import Target
from tests.support.engines import CHUNKED, OK, Raw, answer, app_target, fetch, post, within


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


async def test_head_has_no_body(aiohttp_server: Any, pool: HttpPool) -> None:
    app = web.Application()
    app.router.add_get("/v1/x", answer("hello"))
    target = await app_target(aiohttp_server, app)
    resp = await within(pool.request("HEAD", target, [], b"", connect_timeout_s=5))
    assert resp.status == 200 and resp.headers["Content-Length"] == "5"
    assert await within(resp.read(100)) == b"" and resp.is_eof()
    resp.release()
    assert pool.idle_count(target) == 0  # the parser still counts on a body: not reused
