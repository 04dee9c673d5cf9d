"""A whole answer written in one pass (router.upstream.whole_answer) against aiohttp's own
`Response`, on a real aiohttp server: the same bytes on the wire for every kind of
client, and aiohttp's own behaviour where the one pass does not apply."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from aiohttp import web

from router.upstream.whole_answer import WholeAnswer

BODY = b'{"id": "x", "choices": []}'
HEADERS = {"Content-Type": "application/json", "x-request-id": "r-1", "openai-model": "m"}
DATE = re.compile(rb"\r\nDate: [^\r]+")


def app(seen: dict[str, Any] | None = None) -> web.Application:
    def answer(whole: bool, **extra: str) -> web.StreamResponse:
        headers = {**HEADERS, **extra}
        if whole:
            return WholeAnswer(BODY, headers)
        return web.Response(body=BODY, headers=headers)

    async def aiohttp_own(request: web.Request) -> web.StreamResponse:
        await request.read()
        return answer(False)

    async def one_pass(request: web.Request) -> web.StreamResponse:
        await request.read()
        return answer(True)

    async def closed(request: web.Request) -> web.StreamResponse:
        response = answer(request.path.endswith("whole"))
        response.force_close()
        return response

    async def injected(request: web.Request) -> web.StreamResponse:
        return answer(request.path.endswith("whole"), **{"x-evil": "a\r\nSet-Cookie: b=c"})

    async def gone(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.close()  # the client's reset arrived while the engine answered
        response = WholeAnswer(BODY, HEADERS)
        try:
            await response.prepare(request)
        except ConnectionError as exc:
            assert seen is not None
            seen["gone"] = type(exc).__name__
            raise
        return response

    application = web.Application()
    for path, handler in (("/own", aiohttp_own), ("/whole", one_pass),
                          ("/closed/own", closed), ("/closed/whole", closed),
                          ("/injected/own", injected), ("/injected/whole", injected),
                          ("/gone", gone)):
        application.router.add_route("*", path, handler)
    return application


async def exchange(server: Any, raw: bytes, until_close: bool = False) -> bytes:
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(raw)
    try:
        if until_close:
            return await reader.read()
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"Content-Length: (\d+)", head)[1])  # type: ignore[index]
        return head + await reader.readexactly(length)
    finally:
        writer.close()


def request(method: str, path: str, version: str = "1.1", *extra: str) -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: gw", *extra]
    if method == "POST":
        lines.append("Content-Length: 2")
    return ("\r\n".join(lines) + "\r\n\r\n" + ("{}" if method == "POST" else "")).encode()


@pytest.mark.parametrize(("version", "extra", "until_close"), [
    ("1.1", (), False),
    ("1.1", ("Connection: close",), True),
    ("1.0", (), True),
    ("1.0", ("Connection: keep-alive",), False),
])
async def test_the_bytes_on_the_wire_are_aiohttps_own(aiohttp_server: Any, version: str,
                                                      extra: tuple[str, ...],
                                                      until_close: bool) -> None:
    server = await aiohttp_server(app())
    got = {path: DATE.sub(b"", await exchange(server, request("POST", path, version, *extra),
                                              until_close))
           for path in ("/own", "/whole")}
    assert got["/whole"] == got["/own"]
    assert got["/whole"].endswith(b"\r\n\r\n" + BODY)
    assert b"x-request-id: r-1" in got["/whole"]


async def test_a_date_is_sent(aiohttp_server: Any) -> None:
    server = await aiohttp_server(app())
    assert DATE.search(await exchange(server, request("POST", "/whole")))


async def test_a_head_request_gets_aiohttps_own_head_and_no_body(aiohttp_server: Any) -> None:
    server = await aiohttp_server(app())
    got = {path: DATE.sub(b"", await exchange(server, request("HEAD", path, "1.1",
                                                              "Connection: close"), True))
           for path in ("/own", "/whole")}
    assert got["/whole"] == got["/own"]
    assert got["/whole"].endswith(b"\r\n\r\n")
    assert b"Content-Length: %d" % len(BODY) in got["/whole"]


async def test_pipelined_requests_are_answered_in_order_on_one_connection(
        aiohttp_server: Any) -> None:
    server = await aiohttp_server(app())
    raw = request("POST", "/whole") * 3 + request("GET", "/whole", "1.1", "Connection: close")
    got = await exchange(server, raw, until_close=True)
    assert got.count(b"HTTP/1.1 200 OK") == 4
    assert got.count(BODY) == 4
    assert got.endswith(BODY)


async def test_a_forced_close_says_so_and_closes(aiohttp_server: Any) -> None:
    server = await aiohttp_server(app())
    got = {path: DATE.sub(b"", await exchange(server, request("GET", path), True))
           for path in ("/closed/own", "/closed/whole")}
    assert got["/closed/whole"] == got["/closed/own"]
    assert b"Connection: close" in got["/closed/whole"]


async def test_a_control_character_in_a_header_is_refused_as_aiohttp_refuses_it(
        aiohttp_server: Any) -> None:
    """aiohttp's serialiser raises: nothing is sent, and the connection is dropped."""
    server = await aiohttp_server(app())
    got = {path: await exchange(server, request("GET", path, "1.1"), True)
           for path in ("/injected/own", "/injected/whole")}
    assert got["/injected/whole"] == got["/injected/own"] == b""


async def test_a_client_gone_before_the_write_is_a_connection_error(
        aiohttp_server: Any) -> None:
    seen: dict[str, Any] = {}
    server = await aiohttp_server(app(seen))
    got = await exchange(server, request("GET", "/gone"), until_close=True)
    assert got == b""
    assert seen["gone"] == "ClientConnectionResetError"


async def test_the_app_hears_of_the_answer_before_it_is_sent(aiohttp_server: Any) -> None:
    application = app()

    async def stamp(_: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-stamped"] = "1"

    application.on_response_prepare.append(stamp)
    server = await aiohttp_server(application)
    assert b"x-stamped: 1" in await exchange(server, request("POST", "/whole"))


async def test_an_answer_larger_than_the_write_buffer_reaches_a_slow_reader(
        aiohttp_server: Any) -> None:
    big = b"x" * (4 << 20)

    async def large(_: web.Request) -> web.StreamResponse:
        return WholeAnswer(big, {"Content-Type": "application/octet-stream"})

    application = web.Application()
    application.router.add_get("/large", large)
    server = await aiohttp_server(application)
    reader, writer = await asyncio.open_connection(server.host, server.port, limit=1 << 16)
    writer.write(request("GET", "/large"))
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"Content-Length: %d" % len(big) in head
    assert await reader.readexactly(len(big)) == big
    writer.close()
