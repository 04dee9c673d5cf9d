"""Hostile request bodies: deep nesting, integers beyond 64 bits, value floods, stalled
bodies, bodies sent before a key or its limits are checked, and more body bytes in flight
than the process may hold. Each is refused before it takes a slot, in OpenAI's shape,
while a normal client is served.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from router.app import RunningGateway
from router.request.json_bounds import check_bounds
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


def chat(**extra: Any) -> bytes:
    return orjson.dumps({"model": "chat", "messages": MESSAGES, **extra})


def nested(depth: int) -> bytes:
    """A chat request whose body nests `depth` levels (the top object is level 1)."""
    inner = b"[" * (depth - 1) + b"]" * (depth - 1)
    return chat()[:-1] + b',"deep":' + inner + b"}"


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

def test_brackets_digits_and_quotes_inside_strings_do_not_count() -> None:
    text = '[[[[{{{{ 123456789012345678901234567890 \\" [[[[ \\\\'
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text * 40}],
                         "x": 1.123456789012345678901234, "y": 1e-300, "z": -9223372036854775808,
                         "u": 18446744073709551615})
    assert check_bounds(body, 4, 1024) is None
    padded = body[:-1] + b',"pad":"' + b"{[" * 20_000 + b'"}'  # the numpy path
    assert check_bounds(padded, 4, 1024) is None


@pytest.mark.parametrize("number", [b"18446744073709551616", b"-9223372036854775809",
                                    b"100000000000000000000000000000"])
@pytest.mark.parametrize("pad", [0, 40_000])
def test_an_integer_beyond_64_bits_is_named_with_its_field(number: bytes, pad: int) -> None:
    body = b'{"model":"m","p":"' + b"x" * pad + b'","tools":[{"a":[1,' + number + b"]}]}"
    breach = check_bounds(body, 64, 262_144)
    assert breach is not None and breach.param == "tools"
    assert number.decode() in breach.message


def test_value_count_and_depth_beyond_the_limits() -> None:
    many = b'{"model":"m","x":[' + b",".join([b"{}"] * 5000) + b"]}"
    breach = check_bounds(many, 64, 1024)
    assert breach is not None and "more than 1024 JSON values" in breach.message
    assert check_bounds(many, 64, 262_144) is None
    for depth in (65, 300, 1023):
        breach = check_bounds(nested(depth), 64, 262_144)
        assert breach is not None and f"nests {depth} levels" in breach.message
    assert check_bounds(nested(64), 64, 262_144) is None


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.text(alphabet='[]{}"\\,:0123456789ab', max_size=30),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(alphabet='[]{}"\\:0', max_size=5), inner, max_size=4),
    max_leaves=40,
)


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


def _beyond_64_bits(value: object) -> bool:
    if isinstance(value, list):
        return any(_beyond_64_bits(v) for v in value)
    if isinstance(value, dict):
        return any(_beyond_64_bits(v) for v in value.values())
    return (isinstance(value, int) and not isinstance(value, bool)
            and not -(2**63) <= value <= 2**64 - 1)


def _values(value: object) -> int:
    """Commas and opening brackets outside strings, + 1: what `max_json_values` counts."""
    if isinstance(value, list | dict):
        items = list(value.values()) if isinstance(value, dict) else value
        return max(len(items) - 1, 0) + 1 + sum(_values(v) - 1 for v in items) + 1
    return 1


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.integers(min_value=2, max_value=8), st.integers(min_value=2, max_value=60),
       st.booleans())
def test_the_scan_agrees_with_a_parser(value: object, depth_limit: int, values_limit: int,
                                       numpy_path: bool) -> None:
    pad = "p" * (20_000 if numpy_path else 0)
    doc = {"pad": pad, "v": value}
    raw = json.dumps(doc, indent=None if numpy_path else 1).encode()
    breach = check_bounds(raw, depth_limit, values_limit)
    many = _values(doc) > values_limit
    deep, big = _depth(doc) > depth_limit, _beyond_64_bits(value)
    assert (breach is not None) == (many or deep or big)
    if many:
        assert breach is not None and "JSON values" in breach.message
    elif breach is not None and not deep:
        assert breach.param == "v"


@pytest.mark.parametrize("strings", [10, 3000])
def test_commas_inside_strings_are_not_values(strings: int) -> None:
    items = ["a,b,c,[d,{e"] * strings
    raw = orjson.dumps({"model": "m", "x": items, "pad": "," * 300_000})
    counted = (strings - 1) + 2 + 2 + 1  # commas in the list and the object, 2 opens, + 1
    assert check_bounds(raw, 64, counted) is None
    breach = check_bounds(raw, 64, counted - 1)
    assert breach is not None and "JSON values" in breach.message


# --- through the gateway ----------------------------------------------------------------

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
