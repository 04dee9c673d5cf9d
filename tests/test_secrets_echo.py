"""The secrets canary against a hostile backend that echoes the key it was sent (in an
error message, as a bare error string, or in a header of a good answer): the key reached
the backend, and the gateway relays it to no client, log or metric.
"""

from __future__ import annotations

import aiohttp
import httpx2
import openai
import orjson
import pytest
from aiohttp import web

from tests.support import (
    MESSAGES,
    StartGateway,
    assert_idle,
    serve_app,
)
from tests.support.canaries import (
    BACKEND_ENV,
    USAGE,
    Canaries,
    Seen,
    auth_config,
    client,
    no_leak,
    smuggling,
)


class EchoingBackend:
    """An engine that sends the Authorization it was given back: in its error message, as
    a bare error string, or in a header of a successful answer."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.received: list[str] = []
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self.answer)

    async def answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        auth = request.headers.get("Authorization", "")
        self.received.append(auth)
        echo = {"WWW-Authenticate": f'Bearer realm="{auth}"', "X-Upstream-Auth": auth}
        if self.mode == "header" and body.get("stream"):
            resp = web.StreamResponse(headers={**echo, "Content-Type": "text/event-stream"})
            await resp.prepare(request)
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0,
                     "model": body["model"], "choices": [
                         {"index": 0, "finish_reason": "stop",
                          "delta": {"role": "assistant", "content": "ok"}}]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n")
            await resp.write_eof()
            return resp
        if self.mode == "header":
            answer = {"id": "c", "object": "chat.completion", "created": 0,
                      "model": body["model"], "usage": USAGE, "choices": [
                          {"index": 0, "finish_reason": "stop",
                           "message": {"role": "assistant", "content": "ok"}}]}
            return web.json_response(answer, headers=echo)
        if self.mode == "string":
            return web.json_response({"error": f"forbidden for {auth}"}, status=403,
                                     headers=echo)
        status = {"401": 401, "429": 429, "500": 500}[self.mode]
        error = {"message": f"Incorrect API key provided: {auth}",
                 "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
        return web.json_response({"error": error}, status=status,
                                 headers={**echo, "Retry-After": "1"})


@pytest.mark.parametrize("mode", ["401", "429", "500", "string", "header"])
async def test_a_backend_echoing_its_key_does_not_pass_it_on(
    start: StartGateway, keys: Canaries, mode: str, http: aiohttp.ClientSession,
    caplog_debug: pytest.LogCaptureFixture,
) -> None:
    seen = Seen()
    hostile = EchoingBackend(mode)
    runner, url = await serve_app(hostile.app)
    try:
        gw = await start({
            "auth": auth_config(keys),
            "backends": {"echo": {"url": url + "/v1", "model": "m", "slots": 2,
                                  "api_key_env": BACKEND_ENV}},
            "routes": {"chat": {"primary": "echo"}}})
        async with httpx2.AsyncClient(event_hooks={"response": [seen.sdk_response]}) as sdk_http:
            team = client(gw, keys.team, sdk_http)
            for stream in (False, True):
                try:
                    reply = await team.chat.completions.create(model="chat", messages=MESSAGES,
                                                               stream=stream)
                    if isinstance(reply, openai.AsyncStream):
                        assert [c async for c in reply]
                except openai.APIStatusError:
                    assert mode != "header"
        for stream in (False, True):
            await seen.call(http, "POST", gw.url + "/v1/chat/completions", smuggling(keys.team),
                            orjson.dumps({"model": "chat", "messages": MESSAGES,
                                          "stream": stream}))
        await assert_idle(gw)
        seen.add("metrics", gw.gateway.metrics.exposition())
        await gw.close()
    finally:
        await runner.cleanup()
    seen.logs(caplog_debug)
    calls = 1 if mode == "429" else 4  # after a 429 the backend gets no work for a while
    assert hostile.received == [f"Bearer {keys.backend}"] * calls  # the key went upstream...
    no_leak(seen.items, keys.named())  # ...and never came back
