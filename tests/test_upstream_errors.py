"""Failing upstreams: unreachable, slow, refusing, dropping or redirecting engines; every
error has its status and OpenAI's shape (bad input: tests/test_errors.py).

Also what crosses the gateway: model rewritten, unknown fields kept, hop-by-hop headers
and the client's credentials dropped, the backend's key added from the environment.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web

from router.upstream.simulated.engine import FaultMode
from tests.support import (
    CHAT,
    JSON,
    SdkClients,
    StartGateway,
    assert_idle,
    assert_openai_error,
    closed_port,
    engine,
    gateway_config,
    serve_app,
    sim_backend,
)


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
            "X-Request-Id": "engine-own-id", "X-Slotgate-Backend": "engine-says",
            "X-SLOTGATE-EXPERIMENT": "engine-says"})


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
        assert returned.getall("x-slotgate-backend") == ["big"]  # and none spoofed
        assert "x-slotgate-experiment" not in returned
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
