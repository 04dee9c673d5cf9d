"""An engine's 200 is checked, not trusted. An answer that is not what its API promises
(not JSON, JSON without `choices`, a stream without one valid event) is the engine's fault:
a 502 in the client's API shape, counted against the replica like a dropped connection,
retried on a sibling while nothing was sent. An engine's usage out of bounds (negative,
10^15) is replaced by the gateway's estimate, flagged in the ledger and counted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp import web

from router.app import RunningGateway
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    serve_app,
)
from tests.support.anthropic import ASK, AnthropicClients
from tests.support.ledger import rows_of
from tests.support.scrape import scrape, value

FAST = {"ttft_s": 0, "tokens_per_s": 0, "output_tokens": 8, "max_num_seqs": 8}
GARBAGE_STREAM = b": hello\n\ndata: <html>not an event</html>\n\ndata: [DONE]\n\n"


def chat_answer(usage: dict[str, Any] | None) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "a fine answer"}}]}
    if usage is not None:
        answer["usage"] = usage
    return answer


def chat_stream(usage: dict[str, Any] | None) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m",
             "choices": [{"index": 0, "delta": {"content": "fine"}, "finish_reason": "stop"}]}
    out = b"data: " + orjson.dumps(chunk) + b"\n\n"
    if usage is not None:
        last = {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage}
        out += b"data: " + orjson.dumps(last) + b"\n\n"
    return out + b"data: [DONE]\n\n"


class Liar:
    """A real engine on loopback. `mode` says how it answers every POST with a 200:
    "not_json", "no_choices" (garbage; a stream of garbage when streamed), or "usage"
    (a valid answer whose usage is `usage`). Its health check (GET /v1/models) passes."""

    def __init__(self, mode: str, usage: dict[str, Any] | None = None) -> None:
        self.mode, self.usage, self.hits = mode, usage, 0
        self.gate: asyncio.Event | None = None  # set: every answer waits for it
        self.arrived = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_post("/{tail:.*}", self.answer)
        self.app.router.add_get("/v1/models", self.models)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m"}]})

    async def answer(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        body = await request.json()
        self.arrived.set()
        if self.gate is not None:
            await self.gate.wait()
        if body.get("stream"):
            reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await reply.prepare(request)
            await reply.write(chat_stream(self.usage) if self.mode == "usage"
                              else GARBAGE_STREAM)
            await reply.write_eof()
            return reply
        if self.mode == "not_json":
            return web.Response(body=b"<html>Bad gateway, kind of</html>",
                                content_type="application/json")
        if self.mode == "no_choices":
            return web.json_response({"id": "x", "object": "chat.completion"})
        return web.json_response(chat_answer(self.usage))


async def serve_liar(liar: Liar) -> tuple[web.AppRunner, str]:
    runner, url = await serve_app(liar.app)
    return runner, url + "/v1"


def group(liar_url: str, **extra: Any) -> dict[str, Any]:
    """A group of three: the liar first, two good simulated engines."""
    endpoints = [{"url": liar_url, "slots": 2, "name": "liar"},
                 {"simulated": FAST, "slots": 2, "name": "good-1"},
                 {"simulated": FAST, "slots": 2, "name": "good-2"}]
    return {"backends": {"big": {"model": "m", "endpoints": endpoints, "pick": "round_robin",
                                 "queue_limit": 8, "breaker_failures": 2,
                                 "breaker_open_s": 60, **extra}},
            "routes": {"chat": {"primary": "big", "overflow": "reject"}}}


def single(liar_url: str, ledger: str | None = None) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "backends": {"big": {"model": "m", "url": liar_url, "slots": 2, "queue_limit": 4,
                             "breaker_failures": 100}},
        "routes": {"chat": {"primary": "big", "overflow": "reject"}}}
    if ledger is not None:
        raw["ledger"] = {"url" if ledger.startswith("postgres") else "path": ledger}
    return raw


async def each_api(gw: RunningGateway, sdk: SdkClients, claude: AnthropicClients
                   ) -> list[str]:
    """One request of each API, streamed and not; the replica that answered each."""
    client, ant = sdk(gw), claude(gw)
    served = []
    chat = await client.chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES)
    assert chat.parse().choices[0].message.content
    served.append(chat.headers["x-slotgate-endpoint"])
    async with client.chat.completions.with_streaming_response.create(
            model="chat", messages=MESSAGES, stream=True) as stream:
        served.append(stream.headers["x-slotgate-endpoint"])
        text = "".join([c.choices[0].delta.content or "" async for c in await stream.parse()
                        if c.choices])
        assert text
    message = await ant.messages.with_raw_response.create(
        model="chat", max_tokens=32, messages=ASK)
    body = await message.parse()
    assert body.content and body.content[0].type == "text"
    served.append(message.headers["x-slotgate-endpoint"])
    async with ant.messages.with_streaming_response.create(
            model="chat", max_tokens=32, messages=ASK, stream=True) as events:
        served.append(events.headers["x-slotgate-endpoint"])
        kinds = [e.type async for e in await events.parse()]
        assert "content_block_delta" in kinds and kinds[-1] == "message_stop"
    response = await client.responses.with_raw_response.create(model="chat", input="hi")
    assert response.parse().status == "completed" and response.parse().output_text
    served.append(response.headers["x-slotgate-endpoint"])
    async with client.responses.with_streaming_response.create(
            model="chat", input="hi", stream=True) as rstream:
        served.append(rstream.headers["x-slotgate-endpoint"])
        types = [e.type async for e in await rstream.parse()]
        assert types[-1] == "response.completed"
    return served


@pytest.mark.parametrize("mode", ["not_json", "no_choices"])
async def test_a_garbage_replica_is_retried_on_its_siblings_and_leaves_the_group(
    sdk: SdkClients, claude: AnthropicClients, start: StartGateway, mode: str
) -> None:
    liar = Liar(mode)
    runner, url = await serve_liar(liar)
    try:
        gw = await start(group(url))
        served: list[str] = []
        for _ in range(2):  # 12 answers: before, 1 in 3 would have been the liar's garbage
            served += await each_api(gw, sdk, claude)
        assert len(served) == 12 and "liar" not in served
        assert liar.hits == 2  # each garbage answer counted: its breaker opened at 2
        seats = {s.name: s.healthy for s in gw.gateway.backends["big"].pool.seats()}
        assert seats == {"liar": False, "good-1": True, "good-2": True}
        records = [r for r in gw.gateway.recent if r.status == 200]
        assert len(records) == 12 and sum(r.reason == "retry:big" for r in records) == 2
        await assert_idle(gw)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("mode", ["not_json", "no_choices"])
async def test_garbage_with_no_sibling_is_a_502_in_each_apis_shape(
    sdk: SdkClients, claude: AnthropicClients, start: StartGateway, mode: str
) -> None:
    liar = Liar(mode)
    runner, url = await serve_liar(liar)
    try:
        gw = await start(single(url))
        client, ant = sdk(gw), claude(gw)
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as chat:
                await client.chat.completions.create(model="chat", messages=MESSAGES,
                                                     stream=stream)
            assert chat.value.status_code == 502
            assert chat.value.body["code"] == "upstream_bad_answer"  # type: ignore[index]
            with pytest.raises(anthropic.APIStatusError) as message:
                await ant.messages.create(model="chat", max_tokens=32, messages=ASK,
                                          stream=stream)
            assert message.value.status_code == 502
            assert message.value.body["type"] == "error"  # type: ignore[index]
            assert message.value.body["error"]["type"] == "api_error"  # type: ignore[index]
            with pytest.raises(openai.APIStatusError) as response:
                await client.responses.create(model="chat", input="hi", stream=stream)
            assert response.value.status_code == 502
        assert liar.hits == 6
        rows = [r for r in gw.gateway.recent]
        assert len(rows) == 6 and all(r.status == 502 for r in rows)
        assert {r.error for r in rows} == {"upstream_bad_answer"}
        samples = await scrape(gw)
        assert value(samples, "slotgate_upstream_errors_total", backend="big",
                     kind="invalid") == 6
        await assert_idle(gw)
    finally:
        await runner.cleanup()


async def test_a_stream_already_open_ends_with_an_error_event_not_a_502(
    start: StartGateway
) -> None:
    """A stream that waited in line had its 200 and queue reports sent: its engine's
    garbage ends it with an error event in the client's shape."""
    liar = Liar("not_json")
    liar.gate = asyncio.Event()
    runner, url = await serve_liar(liar)
    try:
        raw = single(url)
        raw["backends"]["big"]["slots"] = 1
        gw = await start(raw)
        async with aiohttp.ClientSession() as http:
            first = asyncio.ensure_future(http.post(
                gw.url + "/v1/chat/completions",
                json={"model": "chat", "messages": MESSAGES}))
            await liar.arrived.wait()  # the only slot is taken
            async with http.post(gw.url + "/v1/messages", json={
                    "model": "chat", "max_tokens": 16, "messages": ASK, "stream": True},
                    headers={"anthropic-version": "2023-06-01"}) as waiting:
                assert waiting.status == 200  # it queued: its stream opened at once
                liar.gate.set()
                body = await waiting.read()
            async with await first as held:
                assert held.status == 502
        assert body.rstrip().endswith(b"}") and b"event: error" in body
        last = body.rstrip().split(b"\n\n")[-1]
        error = orjson.loads(last.split(b"data: ", 1)[1])
        assert error["type"] == "error" and error["error"]["type"] == "api_error"
        assert b"content_block_delta" not in body  # nothing of the garbage was relayed
        await assert_idle(gw)
    finally:
        await runner.cleanup()


BAD_USAGE = [
    {"prompt_tokens": -5, "completion_tokens": 7, "total_tokens": 2},
    {"prompt_tokens": 12, "completion_tokens": 10**15, "total_tokens": 10**15 + 12},
    {"prompt_tokens": 12, "completion_tokens": True, "total_tokens": 13},
]


async def test_engine_usage_out_of_bounds_is_estimated_flagged_and_counted(
    sdk: SdkClients, claude: AnthropicClients, start: StartGateway, ledger_target: str
) -> None:
    liar = Liar("usage")
    runner, url = await serve_liar(liar)
    try:
        gw = await start(single(url, ledger_target))
        samples = await scrape(gw)
        assert value(samples, "slotgate_engine_usage_rejected_total", backend="big") == 0
        client, ant = sdk(gw), claude(gw)
        seen: list[float] = []
        for usage in BAD_USAGE:
            liar.usage = usage
            for stream in (False, True):
                reply = await client.chat.completions.create(
                    model="chat", messages=MESSAGES, max_tokens=50, stream=stream)
                if stream:
                    async for _ in reply:  # type: ignore[union-attr]
                        pass
                samples = await scrape(gw)
                seen.append(value(samples, "slotgate_tokens_total", backend="big",
                                  direction="out")
                            + value(samples, "slotgate_tokens_total", backend="big",
                                    direction="in"))
        message = await ant.messages.create(model="chat", max_tokens=32, messages=ASK)
        assert message.usage.output_tokens >= 0 and message.usage.input_tokens >= 0
        assert message.usage.output_tokens < 10**6
        liar.usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
        await client.chat.completions.create(model="chat", messages=MESSAGES, max_tokens=50)
        samples = await scrape(gw)
        assert value(samples, "slotgate_engine_usage_rejected_total", backend="big") == 7
        assert seen == sorted(seen) and seen[-1] < 10_000  # never down, never 10^15
        rows = sorted(await rows_of(gw, ledger_target), key=lambda r: r.ts)
        assert len(rows) == 8
        for row in rows[:7]:
            assert row.usage_rejected is True and row.tokens_estimated
            assert 0 <= row.prompt_tokens < 1000 and 0 <= row.completion_tokens <= 50
        last = rows[7]
        assert last.usage_rejected is False and not last.tokens_estimated
        assert (last.prompt_tokens, last.completion_tokens) == (12, 3)
    finally:
        await runner.cleanup()


PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kg"
       "AAAABJRU5ErkJggg==")


@pytest.mark.parametrize("media_type", ["text/html", "image/png;x=1", "image/svg+xml",
                                        "image/png,<script>"])
async def test_an_image_media_type_off_the_list_is_a_400_in_anthropics_shape(
    claude: AnthropicClients, start: StartGateway, media_type: str
) -> None:
    gw = await start({"backends": {"big": {"model": "m", "slots": 2, "simulated": FAST}},
                      "routes": {"chat": {"primary": "big"}}})
    ant = claude(gw)

    def ask(kind: str) -> Any:
        return [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": kind, "data": PNG}},
            {"type": "text", "text": "what is this?"}]}]

    with pytest.raises(anthropic.BadRequestError) as refused:
        await ant.messages.create(model="chat", max_tokens=16, messages=ask(media_type))
    body: Any = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "media_type" in body["error"]["message"]
    answered = await ant.messages.create(model="chat", max_tokens=16, messages=ask("image/png"))
    assert answered.content
    await assert_idle(gw)
