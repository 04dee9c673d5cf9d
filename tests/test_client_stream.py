"""A streamed answer's chunks written past aiohttp's writer (router.upstream.client_stream),
on a real aiohttp server: the facts of aiohttp's writer it relies on, the bytes a client
reads, and the cases that go through aiohttp's writer instead."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from router.upstream.client_stream import ClientStream

EVENTS = [b"data: {\"n\": %d}\n\n" % i for i in range(20)]


def app_writing(seen: dict[str, Any]) -> web.Application:
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        client = ClientStream(response, request.transport, 5.0)
        seen["direct"] = 0
        for event in EVENTS:
            if client.put(event):
                seen["direct"] += 1
            else:
                await client.write(event)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/stream", stream)
    return app


async def test_after_the_head_every_chunk_goes_straight_to_the_socket(
        aiohttp_client: Any) -> None:
    seen: dict[str, Any] = {}
    client = await aiohttp_client(app_writing(seen))
    async with client.get("/stream") as resp:
        assert resp.status == 200
        assert resp.headers["Transfer-Encoding"] == "chunked"
        body = await resp.read()
    assert body == b"".join(EVENTS)
    # The first went with the head through aiohttp; with aiohttp's writer as this
    # module expects it (3.14), every later chunk was written directly.
    assert seen["direct"] == len(EVENTS) - 1
    # and the connection is fit for the next request (the last chunk's marker was sent)
    async with client.get("/stream") as resp:
        assert await resp.read() == b"".join(EVENTS)


async def test_an_http_1_0_client_gets_its_unframed_body_through_aiohttp(
        aiohttp_server: Any) -> None:
    seen: dict[str, Any] = {}
    server = await aiohttp_server(app_writing(seen))
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(b"GET /stream HTTP/1.0\r\nHost: x\r\n\r\n")
    raw = await reader.read()  # to the server's close
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower()
    assert body == b"".join(EVENTS)
    assert seen["direct"] == 0


async def test_a_closing_client_is_never_written_past_aiohttp(aiohttp_server: Any) -> None:
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        client = ClientStream(response, request.transport, 5.0)
        await client.write(EVENTS[0])
        assert client.put(EVENTS[1])
        assert request.transport is not None
        request.transport.close()  # as when the client's reset arrives
        outcome.set_result("put" if client.put(EVENTS[2]) else "refused")
        return response

    app = web.Application()
    app.router.add_get("/stream", stream)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as http:
        try:
            async with http.get(server.make_url("/stream")) as resp:
                await resp.read()
        except aiohttp.ClientPayloadError:
            pass  # the server closed mid-body, as it meant to
    assert await outcome == "refused"
