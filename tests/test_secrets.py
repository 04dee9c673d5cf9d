"""The secrets canary.

Recognisable keys, random per run, go through every path of a real gateway: client keys
(one configured by its SHA-256, one read from the environment, one wrong key) and a
backend key (read from the environment, sent upstream). Everything the gateway says is
captured: every log record at DEBUG of every logger but the test's own HTTP client (the
access log on), every response's status line, headers and body, the Prometheus text, the
dashboard feed, stdout and stderr, and every row and byte of the SQLite ledger. No secret
may appear in any of it, as itself, URL-encoded, or by its random part alone. The backend
key must reach the backend, and no client key may. A backend that echoes its key back:
tests/test_secrets_echo.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import aiohttp
import httpx2
import openai
import orjson
import pytest
from aiohttp import web

from router.app import RunningGateway
from router.upstream.simulated.engine import FaultMode
from tests.support import (
    MESSAGES,
    StartGateway,
    assert_idle,
    closed_port,
    engine,
    serve_app,
    sim_backend,
    wait_pools,
)
from tests.support.canaries import (
    BACKEND_ENV,
    LOGGERS,
    USAGE,
    Canaries,
    Seen,
    auth_config,
    bearer,
    client,
    leaks,
    no_leak,
    smuggling,
)

# --- the canaries and the detector ----------------------------------------------------

def test_the_detector_finds_a_planted_canary() -> None:
    """The positive control: a leak in any spelling is found, a hash of the key is not."""
    keys = Canaries()
    secret = {"team": keys.team}
    digest = hashlib.sha256(keys.team.encode()).hexdigest()
    assert leaks([("clean", f"tenant={digest[:12]} sha256={digest} {keys.team[:15]}")],
                 secret) == []
    for planted in (f"Authorization: Bearer {keys.team}", f"GET /?key={quote(keys.team)}",
                    f"key={quote_plus(keys.team)}", keys.team.upper(),
                    f"sk-***-{keys.team.split('-')[3]}"):
        assert leaks([("planted", planted)], secret), planted


# --- a real engine that records what it is sent ---------------------------------------

@dataclass
class Received:
    what: str  # "POST /v1/chat/completions"
    headers: dict[str, str]
    body: bytes


class RecordingBackend:
    """An OpenAI-compatible engine on loopback: records every request, answers JSON or SSE."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self.answer)
        self.app.router.add_post("/v1/completions", self.answer)
        self.app.router.add_get("/v1/models", self.answer)

    async def answer(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.received.append(Received(f"{request.method} {request.path}",
                                      dict(request.headers), raw))
        if request.method == "GET":
            return web.json_response({"object": "list", "data": []})
        body = orjson.loads(raw)
        chat = request.path.endswith("/chat/completions")
        head = {"id": "cmpl-1", "created": 0, "model": body["model"]}
        if not body.get("stream"):
            choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
            if chat:
                choice["message"] = {"role": "assistant", "content": "ok"}
            else:
                choice.update(text="ok", logprobs=None)
            return web.json_response({**head, "object": "chat.completion" if chat
                                      else "text_completion", "choices": [choice],
                                      "usage": USAGE})
        kind = "chat.completion.chunk" if chat else "text_completion"
        said: dict[str, Any] = ({"delta": {"role": "assistant", "content": "ok"}} if chat
                                else {"text": "ok"})
        done: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
        chunks = [{**head, "object": kind, "choices": [
                       {"index": 0, **said, "finish_reason": None}]},
                  {**head, "object": kind, "choices": [
                      {"index": 0, **done, "finish_reason": "stop"}]},
                  {**head, "object": kind, "choices": [], "usage": USAGE}]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def gateway_raw(good_url: str, ledger: Path, keys: Canaries) -> dict[str, Any]:
    keyed: dict[str, Any] = {"api_key_env": BACKEND_ENV}  # every backend: the upstream key
    return {
        "logging": {"access": True, "refusal_interval_s": 0},  # every refusal's line too
        "ledger": {"path": str(ledger / "ledger.sqlite3"), "flush_interval_s": 0.05},
        "auth": auth_config(keys),
        "backends": {
            "good": {"url": good_url + "/v1", "model": "m-good", "slots": 4, **keyed},
            "busy": sim_backend("m-busy", slots=1, **keyed),
            "flaky": sim_backend("m-flaky", slots=2, breaker_failures=50, **keyed),
            "dead": {"url": f"http://127.0.0.1:{closed_port()}/v1", "model": "m-dead",
                     "slots": 1, "connect_timeout_s": 1, "breaker_failures": 2,
                     "breaker_open_s": 60, **keyed},
        },
        "routes": {
            "chat": {"primary": "good"},
            "busy": {"primary": "busy", "overflow": "reject"},
            "broken": {"primary": "flaky"},
            "retry": {"primary": "flaky", "fallbacks": ["good"]},
            "dead": {"primary": "dead"},
        },
    }


# --- every path -----------------------------------------------------------------------

async def drive_sdk(gw: RunningGateway, keys: Canaries, sdk_http: httpx2.AsyncClient) -> None:
    """Success, 400, 401, 404, 429, relayed 500s, a retry, refused connections, a breaker."""
    team, ops = client(gw, keys.team, sdk_http), client(gw, keys.admin, sdk_http)
    assert (await team.chat.completions.create(model="chat", messages=MESSAGES)).choices
    assert [c async for c in await ops.chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, stream_options={"include_usage": True})]
    assert (await team.completions.create(model="chat", prompt="hi")).choices
    assert [c async for c in await team.completions.create(model="chat", prompt="hi",
                                                           stream=True)]
    assert (await team.models.list()).data

    for wrong in (client(gw, keys.wrong, sdk_http), client(gw, keys.team[:-1], sdk_http)):
        with pytest.raises(openai.AuthenticationError):
            await wrong.chat.completions.create(model="chat", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError):  # a key in the body: refused, not echoed
        await team.chat.completions.create(model="chat", messages=MESSAGES,
                                           extra_body={"api_key": keys.team})
    with pytest.raises(openai.NotFoundError):
        await team.chat.completions.create(model="nope", messages=MESSAGES)

    busy = engine(gw, "busy")  # 429: the only slot held, no queue
    busy.hold()
    holder = asyncio.ensure_future(team.chat.completions.create(model="busy",
                                                                messages=MESSAGES))
    await wait_pools(gw, lambda s: s["busy"] == (1, 0))
    for stream in (False, True):
        with pytest.raises(openai.RateLimitError):
            await team.chat.completions.create(model="busy", messages=MESSAGES, stream=stream)
    busy.release()
    assert (await holder).choices

    flaky = engine(gw, "flaky")
    flaky.inject_fault(FaultMode.ERROR_500, count=3)
    for stream in (False, True):  # the backend's 500, relayed
        with pytest.raises(openai.InternalServerError):
            await team.chat.completions.create(model="broken", messages=MESSAGES, stream=stream)
    retried = await team.chat.completions.with_raw_response.create(model="retry",
                                                                  messages=MESSAGES)
    assert retried.headers["x-slotgate-route-reason"] == "retry:flaky"
    flaky.inject_fault(FaultMode.DROP)  # a stream cut after its first byte: error in-band
    with pytest.raises(openai.APIError):
        async for _ in await ops.chat.completions.create(model="broken", messages=MESSAGES,
                                                         stream=True):
            pass

    for stream in (False, True):  # connection refused: 502, twice, then the breaker: 503
        with pytest.raises(openai.APIStatusError) as refused:
            await team.chat.completions.create(model="dead", messages=MESSAGES, stream=stream)
        assert refused.value.status_code == 502
    with pytest.raises(openai.InternalServerError) as unavailable:
        await team.chat.completions.create(model="dead", messages=MESSAGES)
    assert unavailable.value.status_code == 503


async def drive_raw(gw: RunningGateway, keys: Canaries, seen: Seen,
                    http: aiohttp.ClientSession) -> None:
    """Raw requests: credentials smuggled in every header, malformed bodies, no keys."""
    chat = gw.url + "/v1/chat/completions"
    good = orjson.dumps({"model": "chat", "messages": MESSAGES})
    streamed = orjson.dumps({"model": "chat", "messages": MESSAGES, "stream": True})
    assert (await seen.call(http, "POST", chat, smuggling(keys.team), good))[0] == 200
    status, body = await seen.call(http, "POST", chat, smuggling(keys.admin), streamed)
    assert status == 200 and body.endswith(b"data: [DONE]\n\n")
    for data, want in ((b'{"model": "chat", "messages": [', 400), (b"\xff\xfe{}", 400),
                       (b"[1, 2]", 400), (b'{"model": "chat"}', 400)):
        assert (await seen.call(http, "POST", chat, bearer(keys.team), data))[0] == want
    plain = {**bearer(keys.team), "Content-Type": "text/plain"}
    assert (await seen.call(http, "POST", chat, plain, good))[0] == 415
    for refused in ({}, {"Authorization": keys.team}, {"Authorization": f"Basic {keys.wrong}"},
                    bearer(keys.wrong), smuggling(keys.wrong)):
        assert (await seen.call(http, "POST", chat, refused, good))[0] == 401
    assert (await seen.call(http, "POST", gw.url + "/v1/chat/completions?key="
                            + quote(keys.wrong), bearer(keys.wrong), good))[0] == 401
    busy = engine(gw, "busy")  # a queued-then-refused stream, raw: 429 with Retry-After
    busy.hold()
    holder = asyncio.ensure_future(seen.call(http, "POST", chat, bearer(keys.team),
                                             orjson.dumps({"model": "busy",
                                                           "messages": MESSAGES})))
    await wait_pools(gw, lambda s: s["busy"] == (1, 0))
    status, _ = await seen.call(http, "POST", chat, bearer(keys.team), orjson.dumps(
        {"model": "busy", "messages": MESSAGES, "stream": True}))
    assert status == 429
    busy.release()
    assert (await holder)[0] == 200


async def drive_operator(gw: RunningGateway, keys: Canaries, seen: Seen,
                         http: aiohttp.ClientSession, files: tuple[Path, Path]) -> None:
    """/admin/report, /admin/reload (applied and refused), /metrics, /openapi.json, the
    queue page, dashboard and its feed, health, and the framework's own 404 and 405."""
    url = gw.url
    for headers, want in (({}, 401), (bearer(keys.wrong), 401), (bearer(keys.team), 403),
                          (bearer(keys.admin), 200)):
        assert (await seen.call(http, "GET", url + "/admin/report", headers))[0] == want
    assert (await seen.call(http, "GET", url + "/admin/report?route=none&baseline="
                            + quote(keys.wrong), bearer(keys.admin)))[0] == 404
    same, moved = files
    gw.gateway.config_path = str(same)
    for headers, want in (({}, 401), (bearer(keys.team), 403), (bearer(keys.admin), 200)):
        assert (await seen.call(http, "POST", url + "/admin/reload", headers))[0] == want
    gw.gateway.config_path = str(moved)
    assert (await seen.call(http, "POST", url + "/admin/reload", bearer(keys.admin)))[0] == 400
    await gw.reload()  # the signal's way: refused, logged
    gw.gateway.config_path = str(same)
    for path in ("/metrics", "/openapi.json", "/v1/models", "/healthz", "/readyz", "/",
                 "/dashboard", "/static/app.js", "/static/..%2fauth.py", "/nothing",
                 "/v1/chat/completions"):
        status, _ = await seen.call(http, "GET", url + path, smuggling(keys.team))
        assert status in (200, 404, 405), path
    status, event = await seen.call(http, "GET", url + "/dashboard/events", bearer(keys.team),
                                    first_event=True)
    assert status == 200 and event.startswith(b"event: pools")


async def test_no_secret_reaches_a_log_a_metric_a_response_or_the_ledger(
    start: StartGateway, keys: Canaries, tmp_path: Path, http: aiohttp.ClientSession,
    caplog_debug: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str],
) -> None:
    seen = Seen()
    good = RecordingBackend()
    runner, good_url = await serve_app(good.app)
    try:
        raw = gateway_raw(good_url, tmp_path / "ledger", keys)
        files = (tmp_path / "same.yaml", tmp_path / "moved.yaml")
        files[0].write_bytes(orjson.dumps(raw))  # JSON is YAML
        files[1].write_bytes(orjson.dumps({**raw, "server": {"port": 1}}))
        gw = await start(raw)
        async with httpx2.AsyncClient(event_hooks={"response": [seen.sdk_response]}) as sdk_http:
            await drive_sdk(gw, keys, sdk_http)
        await drive_raw(gw, keys, seen, http)
        await drive_operator(gw, keys, seen, http, files)
        await assert_idle(gw)
        seen.add("metrics, read directly", gw.gateway.metrics.exposition())
        seen.add("recent records (dashboard)", repr(list(gw.gateway.recent)))
        await gw.close()  # graceful: the ledger is flushed
    finally:
        await runner.cleanup()
    rows = seen.ledger(tmp_path / "ledger")
    seen.logs(caplog_debug)
    out, err = capfd.readouterr()
    seen.add("stdout", out)
    seen.add("stderr", err)

    # The keys went where they should: the backend key to the backend, on every request.
    posts = [r for r in good.received if r.what.startswith("POST")]
    assert len(posts) == 7  # see drive_sdk and drive_raw
    for r in posts:
        assert {k.lower(): v for k, v in r.headers.items()}["authorization"] == \
            f"Bearer {keys.backend}"
    backend_saw = [(f"backend received {r.what}", "\n".join(f"{k}: {v}" for k, v in
                                                             r.headers.items()))
                   for r in good.received]
    backend_saw += [(f"backend received {r.what} (body)", r.body.decode()) for r in posts]
    no_leak(backend_saw, keys.clients())

    # The capture caught what it should have: the paths ran and were logged and recorded.
    wheres = " ".join(where for where, _ in seen.items)
    for status in ("200", "400", "401", "403", "404", "405", "415", "429", "500", "502",
                   "503"):
        assert f"-> {status} " in wheres, status
    assert sum(r.name == "slotgate.access" for r in caplog_debug.records) >= 30
    assert all(logging.getLogger(name).isEnabledFor(logging.DEBUG) for name in LOGGERS)
    assert rows >= 20  # refusals of callers without a valid key write no row
    assert "llm_rejection_total" in dict(seen.items)["metrics, read directly"]

    no_leak(seen.items, keys.named())
