"""Bad input: every refusal has its status and OpenAI's shape (bodies, paths, limits, what
the HTTP parser refuses). Failing upstreams: tests/test_upstream_errors.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from router.app import RunningGateway
from tests.support import (
    CHAT,
    JSON,
    StartGateway,
    assert_idle,
    assert_openai_error,
    engine,
    gateway_config,
    sim_backend,
)


@pytest.fixture
async def gw(start: StartGateway) -> RunningGateway:
    return await start(gateway_config(sim_backend("m", slots=1, queue_limit=1),
                                      server={"max_body_bytes": 4096}))


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/chat/completions", b"{not json", 400, None),
        ("/v1/chat/completions", b"[1, 2]", 400, None),
        ("/v1/chat/completions", orjson.dumps({"model": "chat"}), 400, "messages"),
        ("/v1/chat/completions", orjson.dumps({"model": "chat", "messages": []}), 400,
         "messages"),
        ("/v1/chat/completions", orjson.dumps({"model": "chat", "messages": ["hi"]}), 400,
         "messages"),
        ("/v1/chat/completions", orjson.dumps({"messages": CHAT["messages"]}), 400, "model"),
        ("/v1/chat/completions", orjson.dumps({**CHAT, "stream": "yes"}), 400, "stream"),
        ("/v1/chat/completions", orjson.dumps({**CHAT, "max_tokens": 0}), 400, "max_tokens"),
        ("/v1/chat/completions", orjson.dumps({**CHAT, "stream_options": 3}), 400,
         "stream_options"),
        ("/v1/completions", orjson.dumps({"model": "chat"}), 400, "prompt"),
        ("/v1/chat/completions", orjson.dumps({**CHAT, "slotgate": 3}), 400, "slotgate"),
        ("/v1/chat/completions", orjson.dumps({**CHAT, "model": "gpt-9"}), 404, "model"),
        ("/v1/chat/completions", orjson.dumps({**CHAT, "api_base": "http://evil/v1"}), 400,
         "api_base"),
        ("/v1/chat/completions", orjson.dumps({**CHAT, "base_url": "http://evil/v1"}), 400,
         "base_url"),
        ("/v1/chat/completions", orjson.dumps({**CHAT, "api_key": "sk-x"}), 400, "api_key"),
        ("/v1/chat/completions", b'{"model": "chat", "messages": "\xff\xfe"}', 400,
         None),  # not UTF-8
    ],
)
async def test_bad_requests(gw: RunningGateway, http: aiohttp.ClientSession, path: str,
                            body: bytes, status: int, param: str | None) -> None:
    async with http.post(gw.url + path, data=body,
                         headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == status
        payload = await resp.json()
    assert_openai_error(payload, "invalid_request_error")
    assert payload["error"]["param"] == param
    if status == 404:
        assert payload["error"]["code"] == "model_not_found"
    assert engine(gw).records == {}  # nothing bad reached the backend
    await assert_idle(gw)


async def test_body_over_limit_declared(gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    big = orjson.dumps({**CHAT, "pad": "x" * 5000})
    async with http.post(gw.url + "/v1/chat/completions", data=big, headers=JSON) as resp:
        assert resp.status == 413
        assert_openai_error(await resp.json(), "invalid_request_error", "request_too_large")
    await assert_idle(gw)


async def test_body_over_limit_chunked_is_refused_before_reading_it_all(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    sent = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal sent
        while sent < 10_000_000:  # bounded: the gateway must answer long before this
            sent += 65536
            yield b" " * 65536

    try:
        async with http.post(gw.url + "/v1/chat/completions", data=endless(),
                             headers=JSON) as resp:
            status = resp.status
            body = await resp.json()
    except aiohttp.ClientError:
        pytest.fail("the gateway should answer 413, not drop the connection")
    assert status == 413
    assert_openai_error(body, "invalid_request_error", "request_too_large")
    assert sent < 10_000_000
    await assert_idle(gw)


async def test_unknown_path_and_method_answer_in_openai_shape(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with http.get(gw.url + "/v1/nothing-here") as resp:
        assert resp.status == 404
        assert_openai_error(await resp.json(), "invalid_request_error")
    async with http.get(gw.url + "/v1/chat/completions") as resp:
        assert resp.status == 405 and resp.headers["Allow"] == "POST"
        assert_openai_error(await resp.json(), "invalid_request_error", "method_not_allowed")
    async with http.delete(gw.url + "/healthz") as resp:
        assert resp.status == 405 and resp.headers["Allow"] == "GET, HEAD"


async def test_health_and_readiness(gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    async with http.get(gw.url + "/healthz") as resp:
        assert resp.status == 200
    async with http.get(gw.url + "/readyz") as resp:
        assert (resp.status, await resp.json()) == (200, {"ready": True})


# --- what crosses the gateway -------------------------------------------------------


# --- failing upstreams ---------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain"])
async def test_a_body_that_is_not_json_is_415(gw: RunningGateway, http: aiohttp.ClientSession,
                                              content_type: str) -> None:
    async with http.post(gw.url + "/v1/chat/completions", data=orjson.dumps(CHAT),
                         headers={"Content-Type": content_type}) as resp:
        assert resp.status == 415
        assert_openai_error(await resp.json(), "invalid_request_error", "unsupported_media_type")
    await assert_idle(gw)


async def test_max_tokens_beyond_the_context_window_is_400(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, context_window=4096)))
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/chat/completions", headers=JSON,
                             data=orjson.dumps({**CHAT, "max_tokens": 5000})) as resp:
            assert resp.status == 400
            body = await resp.json()
    assert_openai_error(body, "invalid_request_error", "context_length_exceeded")
    assert body["error"]["param"] == "max_tokens"
    assert not engine(gw).records  # refused before any slot or engine


async def test_too_many_messages_is_400(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1), server={"max_messages": 3}))
    many = {**CHAT, "messages": [{"role": "user", "content": "a"}] * 4}
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/chat/completions", headers=JSON,
                             data=orjson.dumps(many)) as resp:
            assert resp.status == 400
            body = await resp.json()
    assert_openai_error(body, "invalid_request_error")
    assert body["error"]["param"] == "messages" and "limit is 3" in body["error"]["message"]


async def raw_exchange(gw: RunningGateway, request: bytes) -> tuple[int, Any]:
    """Send bytes as they are (no client library to tidy them); the status and JSON body."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(10):
            answer = await reader.read()  # the gateway closes after a parse error
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body)


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000
         + b"\r\n\r\n", 431, "request_header_fields_too_large"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
         + b"".join(b"X-H%d: v\r\n" % i for i in range(200)) + b"\r\n",
         431, "request_header_fields_too_large"),
        (b"GET /v1/models?" + b"q" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
         414, "uri_too_long"),
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "bad_http_request"),
    ],
    ids=["long-header", "many-headers", "long-url", "garbage"],
)
async def test_requests_the_http_parser_refuses_get_openai_errors(
    gw: RunningGateway, request_bytes: bytes, status: int, code: str
) -> None:
    got, body = await raw_exchange(gw, request_bytes)
    assert got == status
    assert_openai_error(body, "invalid_request_error", code)
    async with aiohttp.ClientSession() as http, http.get(gw.url + "/healthz") as resp:
        assert resp.status == 200  # the server goes on
