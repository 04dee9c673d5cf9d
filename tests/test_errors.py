"""Bad input and failing upstreams: every error has its status and OpenAI's shape.

Also what crosses the gateway: model rewritten, unknown fields kept, hop-by-hop headers
and the client's credentials dropped, the backend's key added from the environment.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web

from router.app import RunningGateway
from router.upstream.simulated.engine import FaultMode
from tests.support import (
    SdkClients,
    StartGateway,
    assert_idle,
    closed_port,
    engine,
    gateway_config,
    serve_app,
    sim_backend,
)

CHAT: dict[str, Any] = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
JSON = {"Content-Type": "application/json"}


def assert_openai_error(body: Any, kind: str, code: str | None = None) -> None:
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    assert body["error"]["type"] == kind
    if code is not None:
        assert body["error"]["code"] == code


@pytest.fixture
async def gw(start: StartGateway) -> RunningGateway:
    return await start(gateway_config(sim_backend("m", slots=1, queue_limit=1),
                                      server={"max_body_bytes": 4096}))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


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

class CaptureBackend:
    """A real HTTP backend that records what it was sent and answers with set headers."""

    def __init__(self) -> None:
        self.seen: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self.chat)

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append((dict(request.headers), body))
        reply = {"id": "x", "object": "chat.completion", "model": body["model"],
                 "choices": [{"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": "ok"}}],
                 "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
        return web.json_response(reply, headers={
            "Connection": "keep-alive, X-Backend-Hop", "X-Backend-Hop": "secret",
            "Keep-Alive": "timeout=5", "X-Backend-Info": "kept",
            "X-Request-Id": "engine-own-id"})


async def test_headers_and_body_crossing_the_gateway(
    start: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BIG_BACKEND_KEY", "sk-backend-from-env")
    backend = CaptureBackend()
    runner, url = await serve_app(backend.app)
    try:
        gw = await start(gateway_config({"url": url + "/v1", "model": "org/real-id", "slots": 2,
                                         "api_key_env": "BIG_BACKEND_KEY"}))
        async with aiohttp.ClientSession() as http:
            async with http.post(
                gw.url + "/v1/chat/completions",
                data=orjson.dumps({**CHAT, "temperature": 0.3, "tools": [], "vendor_x": {"a": 1}}),
                headers={"Authorization": "Bearer sk-client-secret", "Content-Type":
                         "application/json", "Connection": "keep-alive, X-Client-Hop",
                         "X-Client-Hop": "drop me", "X-Api-Key": "sk-other-secret",
                         "OpenAI-Organization": "org-1", "X-Request-Id": "trace-42"},
            ) as resp:
                assert resp.status == 200
                answer = await resp.json()
                returned = resp.headers
        headers, body = backend.seen[0]
        lower = {k.lower(): v for k, v in headers.items()}
        assert body["model"] == "org/real-id"
        assert body["temperature"] == 0.3 and body["tools"] == [] and body["vendor_x"] == {"a": 1}
        assert lower["authorization"] == "Bearer sk-backend-from-env"
        assert "x-client-hop" not in lower and "x-api-key" not in lower
        assert "openai-organization" not in lower  # not on the allow-list: the gateway's
        assert lower["x-request-id"] == "trace-42"
        assert answer["model"] == "org/real-id"
        assert "X-Backend-Hop" not in returned and "Keep-Alive" not in returned
        assert returned["X-Backend-Info"] == "kept"
        assert returned.getall("x-request-id") == ["trace-42"]  # one: the gateway's
        await assert_idle(gw)
    finally:
        await runner.cleanup()


async def test_backend_without_key_env_sends_no_authorization(
    sdk: SdkClients, start: StartGateway
) -> None:
    backend = CaptureBackend()
    runner, url = await serve_app(backend.app)
    try:
        gw = await start(gateway_config({"url": url + "/v1", "model": "m", "slots": 1}))
        await sdk(gw).chat.completions.create(model="chat", messages=CHAT["messages"])
        assert "authorization" not in {k.lower() for k in backend.seen[0][0]}
        await assert_idle(gw)
    finally:
        await runner.cleanup()


# --- failing upstreams ---------------------------------------------------------------

async def test_unreachable_backend_is_502(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(gateway_config({"url": f"http://127.0.0.1:{closed_port()}/v1",
                                     "model": "m", "slots": 1}))
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError) as caught:
            await sdk(gw).chat.completions.create(model="chat", messages=CHAT["messages"],
                                                  stream=stream)
        assert caught.value.status_code == 502
        assert_openai_error(caught.value.response.json(), "api_error", "upstream_unreachable")
    await assert_idle(gw)


@pytest.mark.parametrize("stream", [False, True])
async def test_first_byte_timeout_is_504_and_aborts_the_engine(
    sdk: SdkClients, start: StartGateway, stream: bool
) -> None:
    gw = await start(gateway_config(sim_backend("m", 1, first_byte_timeout_s=0.2)))
    sim = engine(gw)
    sim.inject_fault(FaultMode.HANG)
    with pytest.raises(openai.APIStatusError) as caught:
        await sdk(gw).chat.completions.create(model="chat", messages=CHAT["messages"],
                                              stream=stream)
    assert caught.value.status_code == 504
    assert_openai_error(caught.value.response.json(), "api_error", "upstream_timeout")
    await sim.wait_until(lambda e: all(r.aborted for r in e.records.values()))
    await assert_idle(gw)


async def test_upstream_error_status_and_message_are_relayed(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend("m", 1)))
    engine(gw).inject_fault(FaultMode.ERROR_500)
    with pytest.raises(openai.InternalServerError) as caught:
        await sdk(gw).chat.completions.create(model="chat", messages=CHAT["messages"])
    assert caught.value.status_code == 500
    assert_openai_error(caught.value.response.json(), caught.value.body["type"])  # type: ignore[index]
    await assert_idle(gw)


@pytest.mark.parametrize("mode", [FaultMode.REFUSE, FaultMode.DROP])
async def test_connection_dropped_by_backend_before_answer_is_502(
    sdk: SdkClients, start: StartGateway, mode: FaultMode
) -> None:
    gw = await start(gateway_config(sim_backend("m", 1)))
    engine(gw).inject_fault(mode)
    with pytest.raises(openai.APIStatusError) as caught:
        await sdk(gw).chat.completions.create(model="chat", messages=CHAT["messages"])
    assert caught.value.status_code == 502
    await assert_idle(gw)


async def test_drop_mid_stream_ends_the_stream_with_one_error_event(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend("m", 1)))
    engine(gw).inject_fault(FaultMode.DROP)
    stream = await sdk(gw).chat.completions.create(model="chat", messages=CHAT["messages"],
                                                   stream=True)
    with pytest.raises(openai.APIError) as caught:
        async for _ in stream:
            pass
    assert caught.value.body["code"] == "upstream_dropped"  # type: ignore[index]
    await assert_idle(gw)


async def test_queued_stream_whose_upstream_fails_gets_an_in_band_error(
    sdk: SdkClients, start: StartGateway,
) -> None:
    gw = await start(gateway_config(sim_backend("m", 1, queue_limit=1)))
    sim = engine(gw)
    sim.hold()
    client = sdk(gw)
    holder = asyncio.create_task(client.chat.completions.create(
        model="chat", messages=CHAT["messages"], extra_headers={"X-Request-Id": "holder"}))
    await sim.wait_until(lambda e: "holder" in e.records)
    stream = await client.chat.completions.create(model="chat", messages=CHAT["messages"],
                                                  stream=True)  # 200 at once: it is queued
    sim.inject_fault(FaultMode.ERROR_500)
    sim.release()
    with pytest.raises(openai.APIError) as caught:
        async for _ in stream:
            pass
    assert caught.value.message == "simulated backend failure"  # the backend's own words
    await holder
    await assert_idle(gw)


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


async def test_an_upstream_redirect_is_not_followed(start: StartGateway) -> None:
    followed: list[str] = []

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect("/elsewhere/v1/chat/completions")

    async def elsewhere(request: web.Request) -> web.Response:
        followed.append(request.path)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", redirect)
    app.router.add_post("/elsewhere/v1/chat/completions", elsewhere)
    runner, url = await serve_app(app)
    try:
        gw = await start(gateway_config({"url": url + "/v1", "model": "m", "slots": 1}))
        async with aiohttp.ClientSession() as http:
            async with http.post(gw.url + "/v1/chat/completions", headers=JSON,
                                 data=orjson.dumps(CHAT)) as resp:
                assert resp.status == 502
        assert followed == []
        await assert_idle(gw)
    finally:
        await runner.cleanup()


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


async def test_a_backend_refusing_the_gateways_key_is_502_not_the_clients_401(
    sdk: SdkClients, start: StartGateway,
) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "bad key sk-backend-xyz",
                                            "type": "invalid_request_error"}}, status=401,
                                 headers={"WWW-Authenticate": 'Bearer realm="engine"'})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", refuse)
    runner, url = await serve_app(app)
    try:
        gw = await start(gateway_config({"url": url + "/v1", "model": "m", "slots": 1}))
        with pytest.raises(openai.APIStatusError) as err:
            await sdk(gw).chat.completions.create(model="chat", messages=CHAT["messages"])
        assert err.value.status_code == 502  # the client's own key was fine
        assert_openai_error(err.value.body and {"error": err.value.body}, "api_error",
                            "upstream_auth_failed")
        assert "sk-backend" not in str(err.value.body)
        assert "www-authenticate" not in err.value.response.headers
        await assert_idle(gw)
    finally:
        await runner.cleanup()


async def test_a_backend_cookie_is_neither_returned_nor_replayed(
    sdk: SdkClients, start: StartGateway
) -> None:
    backend = CaptureBackend()

    @web.middleware
    async def set_cookie(request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request)
        response.set_cookie("session", f"for-{request.headers.get('X-Request-Id')}")
        return response

    backend.app.middlewares.append(set_cookie)
    runner, url = await serve_app(backend.app)
    try:
        by_name = url.replace("127.0.0.1", "localhost")  # a jar keeps no cookie of an IP
        gw = await start(gateway_config({"url": by_name + "/v1", "model": "m", "slots": 1}))
        for client in ("alice", "bob"):
            reply = await sdk(gw).chat.completions.with_raw_response.create(
                model="chat", messages=CHAT["messages"], extra_headers={"X-Request-Id": client})
            assert "set-cookie" not in reply.headers
        assert [h.get("Cookie") for h, _ in backend.seen] == [None, None]  # alice's not sent
        await assert_idle(gw)
    finally:
        await runner.cleanup()
