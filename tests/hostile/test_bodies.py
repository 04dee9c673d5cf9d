"""Hostile request bodies against a gateway: deep nesting, integers beyond 64 bits, value
floods, stalled
bodies, bodies sent before a key or its limits are checked, and more body bytes in flight
than the process may hold. Each is refused before it takes a slot, in OpenAI's shape,
while a normal client is served.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from router.app import RunningGateway
from tests.hostile.conftest import chat, nested
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    serve_app,
    sim_backend,
    wait_pools,
)

KEY = "sk-hostile-0123456789"


def assert_openai_error(body: Any, status_kind: str, code: str | None = None) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    assert body["error"]["type"] == status_kind
    if code is not None:
        assert body["error"]["code"] == code


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def post(http: aiohttp.ClientSession, gw: RunningGateway, body: bytes,
               path: str = "/v1/chat/completions",
               **headers: str) -> tuple[int, Any, dict[str, str]]:
    async with http.post(gw.url + path, data=body,
                         headers={"Content-Type": "application/json", **headers}) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


class Capture:
    """A real HTTP engine that keeps the bytes of each body it is sent."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self.chat)

    async def chat(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.read())
        reply = {"id": "x", "object": "chat.completion", "model": "m",
                 "choices": [{"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": "ok"}}],
                 "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
        return web.json_response(reply)


# --- raw HTTP, for what a well-behaved client would not send ----------------------------

async def connect(gw: RunningGateway, head: bytes,
                  body: bytes = b"") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + body)
    await writer.drain()
    return reader, writer


def head(length: int | None, key: str | None = None, extra: str = "") -> bytes:
    lines = ["POST /v1/chat/completions HTTP/1.1", "Host: gw", "Content-Type: application/json"]
    lines.append(f"Content-Length: {length}" if length is not None
                 else "Transfer-Encoding: chunked")
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


async def response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], Any]:
    """One response (status, lower-cased headers, JSON body), within a generous bound."""
    async with asyncio.timeout(30):
        status_line = await reader.readline()
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, orjson.loads(body)


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


# --- the byte-level checks themselves ---------------------------------------------------

@pytest.fixture
async def gw(start: StartGateway) -> RunningGateway:
    return await start(gateway_config(sim_backend("m", slots=1, queue_limit=1)))


@pytest.mark.parametrize("depth", [300, 600, 1023])
async def test_deep_json_is_400_before_any_slot(gw: RunningGateway, http: aiohttp.ClientSession,
                                                depth: int) -> None:
    status, body, _ = await post(http, gw, nested(depth))
    assert status == 400
    assert_openai_error(body, "invalid_request_error")
    assert "max_json_depth" in body["error"]["message"]
    assert engine(gw).records == {}  # nothing reached the engine; no slot was taken
    at_limit = await post(http, gw, nested(64))
    assert at_limit[0] == 200
    await assert_idle(gw)


async def test_the_deepest_body_allowed_is_reencoded_for_the_engine(
        start: StartGateway, http: aiohttp.ClientSession) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1),
                                    server={"max_json_depth": 128}))
    assert (await post(http, gw, nested(128)))[0] == 200  # orjson.dumps takes 128 levels
    assert (await post(http, gw, nested(129)))[0] == 400
    await assert_idle(gw)


async def test_integers_reach_the_engine_unchanged_or_are_refused(
        start: StartGateway, http: aiohttp.ClientSession) -> None:
    backend = Capture()
    runner, url = await serve_app(backend.app)
    try:
        gw = await start(gateway_config({"url": url + "/v1", "model": "m", "slots": 1}))
        status, body, _ = await post(http, gw, chat()[:-1] + b',"seed":18446744073709551616}')
        assert status == 400 and body["error"]["param"] == "seed"
        assert "18446744073709551616" in body["error"]["message"]
        status, body, _ = await post(http, gw, chat()[:-1] + b',"temperature":1e400}')
        assert status == 400  # a float that overflows is not made infinite either
        assert backend.bodies == []
        kept = chat()[:-1] + (b',"seed":18446744073709551615,"low":-9223372036854775808,'
                              b'"vendor_x":{"id":"123456789012345678901234567890"}}')
        assert (await post(http, gw, kept))[0] == 200
        seen = orjson.loads(backend.bodies[0])
        assert seen["seed"] == 2**64 - 1 and seen["low"] == -(2**63)
        assert seen["vendor_x"] == {"id": "123456789012345678901234567890"}
        await assert_idle(gw)
    finally:
        await runner.cleanup()


async def test_a_flood_of_tiny_values_is_refused_before_parsing(
        start: StartGateway, http: aiohttp.ClientSession) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1),
                                    server={"max_json_values": 4096}))
    flood = chat()[:-1] + b',"x":[' + b",".join([b"{}"] * 10_000) + b"]}"
    status, body, _ = await post(http, gw, flood)
    assert status == 400 and "max_json_values" in body["error"]["message"]
    assert (await post(http, gw, chat()))[0] == 200
    await assert_idle(gw)


async def test_a_stalled_body_gets_408_at_the_read_timeout(
    sdk: SdkClients, start: StartGateway
) -> None:
    timeout_s = 0.5
    gw = await start(gateway_config(sim_backend("m", slots=1),
                                    server={"body_read_timeout_s": timeout_s}))
    began = time.perf_counter()
    reader, writer = await connect(gw, head(1000), chat()[:20])  # 20 of 1,000 bytes
    try:
        reply = await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)
        assert reply.choices[0].message.content  # a normal client is served meanwhile
        status, headers, body = await response(reader)
        answered = time.perf_counter() - began
        async with asyncio.timeout(30):
            assert await reader.read() == b""  # then the gateway closes the connection
        closed = time.perf_counter() - began
    finally:
        await close(writer)
    assert status == 408
    assert_openai_error(body, "invalid_request_error", "request_timeout")
    assert headers["connection"] == "close"
    assert timeout_s <= answered < 5 * timeout_s  # at the deadline, not 10 s later
    assert closed < 5 * timeout_s  # not after aiohttp's 10 s of lingering
    assert any(r.status == 408 for r in gw.gateway.recent)
    await assert_idle(gw)


def auth_config(**key_limits: Any) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=1, queue_limit=1))
    raw["auth"] = {"enabled": True, "keys": [
        {"id": "k", "tenant": "t", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
         **key_limits}]}
    return raw


async def test_a_wrong_key_is_refused_before_any_body_byte(start: StartGateway) -> None:
    gw = await start(auth_config())
    reader, writer = await connect(gw, head(7_000_000, key="sk-wrong-0123456789"))
    try:
        status, _, body = await response(reader)  # no body byte was ever sent
    finally:
        await close(writer)
    assert status == 401
    assert_openai_error(body, "invalid_request_error")
    assert gw.gateway.bodies.held == 0
    await assert_idle(gw)


async def test_the_keys_concurrency_cap_refuses_before_the_body_is_read(
        sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(auth_config(max_concurrent=1))
    sim = engine(gw)
    sim.hold()
    client = sdk(gw, api_key=KEY)
    running = asyncio.create_task(
        client.chat.completions.create(model="chat", messages=MESSAGES))
    try:
        await sim.wait_until(lambda e: e.held == 1)
        reader, writer = await connect(gw, head(7_000_000, key=KEY))
        try:
            status, headers, body = await response(reader)  # no body byte was ever sent
        finally:
            await close(writer)
        assert status == 429 and headers["retry-after"]
        assert_openai_error(body, "rate_limit_error", "concurrency_limit")
        assert 0 < gw.gateway.bodies.held < 7_000_000  # only the running request's body
    finally:
        sim.release()
        await running
    assert gw.gateway.bodies.held == 0
    await assert_idle(gw)


async def test_body_bytes_in_flight_are_bounded_across_the_process(
        start: StartGateway, http: aiohttp.ClientSession) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=2, queue_limit=1), server={
        "max_body_bytes": 4096, "max_inflight_body_bytes": 8192}))
    sim = engine(gw)
    sim.hold()
    padded = chat(pad="x" * 3800)  # about 3.9 KiB
    first = [asyncio.create_task(post(http, gw, padded)) for _ in range(2)]
    try:  # two running requests hold their bodies until they end: 7.8 of 8 KiB
        await sim.wait_until(lambda e: e.held == 2)
        status, body, headers = await post(http, gw, padded)
        assert status == 503 and headers["Retry-After"] == "1"
        assert_openai_error(body, "server_error", "inflight_body_bytes")
        small = asyncio.create_task(post(http, gw, chat()))  # still fits: served
        await wait_pools(gw, lambda s: s["big"] == (2, 1))
    finally:
        sim.release()
    assert [(await task)[0] for task in first] == [200, 200]
    assert (await small)[0] == 200
    assert gw.gateway.bodies.held == 0
    await assert_idle(gw)


async def refused_in_flight(gw: RunningGateway, http: aiohttp.ClientSession, how: str,
                            padded: bytes) -> tuple[int, dict[str, str], Any]:
    """Send `padded` chunked (its size unknown until it arrives) or gzip-compressed (its
    declared length that of the compressed bytes): status, headers (lower-case), body."""
    if how == "gzip":
        packed = gzip.compress(padded)
        assert len(packed) < 200  # declared: far under the room left
        status, body, headers = await post(http, gw, packed, **{"Content-Encoding": "gzip"})
        return status, {k.lower(): v for k, v in headers.items()}, body
    reader, writer = await connect(
        gw, head(None), b"%x\r\n%s\r\n0\r\n\r\n" % (len(padded), padded))
    try:
        return await response(reader)
    finally:
        await close(writer)


@pytest.mark.parametrize("how", ["chunked", "gzip"])
async def test_a_body_of_unknown_size_is_counted_as_it_arrives(
    start: StartGateway, how: str
) -> None:
    """A chunked body counts chunk by chunk; a compressed one by what it inflates to, so a
    small gzip body cannot slip a large one past the bound."""
    gw = await start(gateway_config(sim_backend("m", slots=1), server={
        "max_body_bytes": 4096, "max_inflight_body_bytes": 4096}))
    sim = engine(gw)
    sim.hold()
    async with aiohttp.ClientSession() as http:
        running = asyncio.create_task(post(http, gw, chat(pad="x" * 3000)))
        try:
            await sim.wait_until(lambda e: e.held == 1)
            status, headers, body = await refused_in_flight(gw, http, how,
                                                            chat(pad="x" * 2000))
            assert status == 503 and headers["retry-after"]
            assert_openai_error(body, "server_error", "inflight_body_bytes")
        finally:
            sim.release()
        assert (await running)[0] == 200
    assert gw.gateway.bodies.held == 0
    await assert_idle(gw)
