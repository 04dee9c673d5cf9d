"""/v1/messages with the official `anthropic` SDK, over simulated engines: answers and
streams, a tool round trip, count_tokens, the model list, and errors in Anthropic's shape."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import anthropic
import pytest
from aiohttp import web

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
from tests.support.anthropic import ASK, WEATHER, WEATHER_INPUT, AnthropicClients

TEXT = "the quick brown fox jumps over a lazy "  # the simulated engine's 8 tokens


async def test_create_answers_a_message(claude: AnthropicClients, start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=2)))
    raw = await claude(gw).messages.with_raw_response.create(
        model="chat", max_tokens=100, messages=ASK, system="be brief",
        metadata={"user_id": "u1"})
    message = await raw.parse()
    assert message.type == "message" and message.role == "assistant"
    assert message.model == "chat"
    [block] = message.content
    assert isinstance(block, anthropic.types.TextBlock) and block.text == TEXT
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.output_tokens == 8 and message.usage.input_tokens > 0
    assert raw.headers["x-slotgate-backend"] == "big"
    cut = await claude(gw).messages.create(model="chat", max_tokens=3, messages=ASK)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    await assert_idle(gw)


async def test_stream_tells_the_same_message(claude: AnthropicClients,
                                             start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=2)))
    async with claude(gw).messages.stream(model="chat", max_tokens=100, messages=ASK) as s:
        pieces = [text async for text in s.text_stream]
        final = await s.get_final_message()
    assert "".join(pieces) == TEXT and len(pieces) == 8  # one delta per token
    assert final.content[0].type == "text" and final.content[0].text == TEXT
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 8
    await assert_idle(gw)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_round_trip(claude: AnthropicClients, start: StartGateway,
                                 stream: bool) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=2)))
    client = claude(gw)
    asked: Any = [{"role": "user", "content": "what is the weather in x?"}]

    async def ask(messages: Any) -> Any:
        if not stream:
            return await client.messages.create(model="chat", max_tokens=200,
                                                tools=[WEATHER], messages=messages)
        async with client.messages.stream(model="chat", max_tokens=200, tools=[WEATHER],
                                          messages=messages) as s:
            return await s.get_final_message()

    call = await ask(asked)
    assert call.stop_reason == "tool_use"
    [use] = call.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == WEATHER_INPUT
    answered = await ask([*asked, {"role": "assistant", "content": call.content},
                          {"role": "user", "content": [
                              {"type": "tool_result", "tool_use_id": use.id,
                               "content": "sunny"}]}])
    assert answered.stop_reason == "end_turn"
    assert answered.content[0].type == "text" and answered.content[0].text == TEXT
    await assert_idle(gw)


async def test_tool_choice_none_answers_in_text(claude: AnthropicClients,
                                                start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    message = await claude(gw).messages.create(model="chat", max_tokens=50, tools=[WEATHER],
                                               tool_choice={"type": "none"}, messages=ASK)
    assert message.stop_reason == "end_turn" and message.content[0].type == "text"
    await assert_idle(gw)


async def test_tools_need_a_backend_that_serves_them(claude: AnthropicClients,
                                                     start: StartGateway) -> None:
    """The capability check reads the translated conversation: a tool exchange needs
    `tools`, so the fallback that lacks it is never chosen for the overflow."""
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=0),
                                    sim_backend("s", slots=1, capabilities=[]),
                                    overflow="fallback"))
    sim = engine(gw)
    sim.hold()
    holder = asyncio.create_task(claude(gw).messages.create(
        model="chat", max_tokens=10, messages=ASK))
    await wait_pools(gw, lambda s: s["big"] == (1, 0))
    with pytest.raises(anthropic.RateLimitError):
        await claude(gw).messages.create(model="chat", max_tokens=10, tools=[WEATHER],
                                         messages=ASK)
    plain = await claude(gw).messages.create(model="chat", max_tokens=10, messages=ASK)
    assert plain.content[0].type == "text"  # the fallback took the plain one
    sim.release()
    await holder
    await assert_idle(gw)


async def test_count_tokens_and_the_model_list(claude: AnthropicClients,
                                               start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    client = claude(gw)
    short = await client.messages.count_tokens(model="chat", messages=ASK)
    long = await client.messages.count_tokens(model="chat", messages=[
        {"role": "user", "content": "tell me something " * 100}])
    assert 0 < short.input_tokens < long.input_tokens
    page = await client.models.list()
    assert [m.id for m in page.data] == ["chat"] and page.data[0].type == "model"
    with pytest.raises(anthropic.NotFoundError) as missing:
        await client.messages.count_tokens(model="nope", messages=ASK)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert engine(gw).records == {}  # no engine was asked
    await assert_idle(gw)


async def test_the_openai_model_list_is_unchanged(sdk: SdkClients,
                                                  start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    page = await sdk(gw).models.list()
    assert [m.id for m in page.data] == ["chat"] and page.data[0].object == "model"
    answer = await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)
    assert answer.choices[0].message.content  # chat is spoken as before
    await assert_idle(gw)


async def test_errors_are_in_anthropics_shape(claude: AnthropicClients,
                                              start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    client = claude(gw)
    with pytest.raises(anthropic.BadRequestError) as bad:
        await client.messages.create(model="chat", max_tokens=10, messages=ASK,
                                     extra_body={"tool_choice": {"type": "bogus"}})
    assert bad.value.body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "tool_choice.type: 'bogus' is not one of auto, any, tool, none"}}
    with pytest.raises(anthropic.NotFoundError) as missing:
        await client.messages.create(model="nope", max_tokens=10, messages=ASK)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    async with aiohttp.ClientSession() as http:
        async with http.post(gw.url + "/v1/messages", json={
                "model": "chat", "messages": ASK}) as resp:
            assert resp.status == 400
            assert await resp.json() == {"type": "error", "error": {
                "type": "invalid_request_error", "message": "max_tokens: field required"}}
        for blocks, what in (([{"type": "document", "source": {}}], "'document' blocks"),):
            async with http.post(gw.url + "/v1/messages", json={
                    "model": "chat", "max_tokens": 5,
                    "messages": [{"role": "user", "content": blocks}]}) as resp:
                assert resp.status == 400 and what in (await resp.json())["error"]["message"]
        async with http.post(gw.url + "/v1/messages", json={
                "model": "chat", "max_tokens": 5, "messages": ASK,
                "tools": [{"type": "web_search_20250305", "name": "web_search"}]}) as resp:
            assert resp.status == 400 and "server tool" in (await resp.json())["error"]["message"]
    await assert_idle(gw)


async def test_a_full_queue_is_a_rate_limit_error_with_retry_after(
    claude: AnthropicClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_limit=0)))
    sim = engine(gw)
    sim.hold()
    holder = asyncio.create_task(claude(gw).messages.create(
        model="chat", max_tokens=10, messages=ASK))
    await wait_pools(gw, lambda s: s["big"] == (1, 0))
    for stream in (False, True):
        with pytest.raises(anthropic.RateLimitError) as limited:
            await claude(gw).messages.create(model="chat", max_tokens=10, messages=ASK,
                                             stream=stream)
        assert int(limited.value.response.headers["retry-after"]) >= 1
        assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    sim.release()
    await holder
    await assert_idle(gw)


@pytest.mark.parametrize("status", [429, 503])
async def test_an_engines_own_refusal_gets_a_retry_after(
    claude: AnthropicClients, start: StartGateway, status: int
) -> None:
    """Every Anthropic-protocol 429 and 503 carries retry-after, even when the gateway
    relays an engine's own answer that had none."""

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "busy", "type": "server_error"}},
                                 status=status)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", refuse)
    runner, url = await serve_app(app)
    try:
        gw = await start(gateway_config({"url": url + "/v1", "model": "m", "slots": 1},
                                        server={"retry_after_min_s": 2}))
        with pytest.raises(anthropic.APIStatusError) as refused:
            await claude(gw).messages.create(model="chat", max_tokens=10, messages=ASK)
        assert refused.value.status_code == status
        assert refused.value.response.headers["retry-after"] == "2"
        assert refused.value.body["error"]["type"] == (  # type: ignore[index]
            "rate_limit_error" if status == 429 else "overloaded_error")
        await assert_idle(gw)
    finally:
        await runner.cleanup()


async def test_a_queue_timeout_is_a_503_with_retry_after(claude: AnthropicClients,
                                                         start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, queue_timeout_s=0.05,
                                                queue_limit=1)))
    sim = engine(gw)
    sim.hold()
    holder = asyncio.create_task(claude(gw).messages.create(
        model="chat", max_tokens=10, messages=ASK))
    await wait_pools(gw, lambda s: s["big"] == (1, 0))
    with pytest.raises(anthropic.InternalServerError) as timed_out:  # its queue wait is over
        await claude(gw).messages.create(model="chat", max_tokens=10, messages=ASK)
    assert timed_out.value.status_code == 503
    assert int(timed_out.value.response.headers["retry-after"]) >= 1
    assert timed_out.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    sim.release()
    await holder
    await assert_idle(gw)


async def test_x_api_key_and_bearer_both_authenticate(
    claude: AnthropicClients, start: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MSG_KEY", "sk-ant-good")
    config = gateway_config(sim_backend("m", slots=1))
    config["auth"] = {"enabled": True, "keys": [{"id": "k1", "tenant": "t1", "key_env": "MSG_KEY"}]}
    gw = await start(config)
    ok = await claude(gw, api_key="sk-ant-good").messages.create(
        model="chat", max_tokens=5, messages=ASK)
    assert ok.content
    bearer = claude(gw, api_key=None, auth_token="sk-ant-good")  # Authorization: Bearer
    assert (await bearer.messages.create(model="chat", max_tokens=5, messages=ASK)).content
    with pytest.raises(anthropic.AuthenticationError) as refused:
        await claude(gw, api_key="sk-ant-wrong").messages.create(
            model="chat", max_tokens=5, messages=ASK)
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError):
        await claude(gw, api_key="sk-ant-wrong").messages.count_tokens(model="chat",
                                                                       messages=ASK)
    async with aiohttp.ClientSession() as http:  # two different keys: neither wins
        async with http.post(gw.url + "/v1/messages", json={
                "model": "chat", "max_tokens": 5, "messages": ASK},
                headers={"x-api-key": "sk-ant-good", "Authorization": "Bearer other"}) as resp:
            assert resp.status == 401
            error = (await resp.json())["error"]
            assert error["type"] == "authentication_error"
            assert "'Authorization: Bearer' and 'x-api-key'" in error["message"]
            assert resp.headers["x-should-retry"] == "false"
        async with http.post(gw.url + "/v1/messages", json={  # the same key twice: that key
                "model": "chat", "max_tokens": 5, "messages": ASK},
                headers={"x-api-key": "sk-ant-good", "Authorization": "Bearer sk-ant-good"}
        ) as resp:
            assert resp.status == 200
    await assert_idle(gw)


async def test_the_ledger_and_metrics_count_messages_like_chat(
    claude: AnthropicClients, start: StartGateway
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    await claude(gw).messages.create(model="chat", max_tokens=5, messages=ASK,
                                     extra_headers={"X-Request-Id": "msg-1"})
    rec = next(r for r in gw.gateway.recent if r.request_id == "msg-1")
    assert rec.endpoint == "/v1/messages" and rec.status == 200 and rec.backend == "big"
    assert rec.completion_tokens == 5 and not rec.tokens_estimated
    await assert_idle(gw)


async def test_messages_are_served_by_engines_that_speak_chat_and_refused_elsewhere(
        claude: AnthropicClients, start: StartGateway) -> None:
    """A Messages request is chat upstream: a backend serving chat takes it (it need not
    list `messages`); one that only embeds refuses it, in Anthropic's shape."""
    raw = gateway_config(sim_backend("m", slots=1, apis=["chat"]))
    raw["backends"]["vectors"] = sim_backend("e", slots=1, apis=["embeddings"])
    raw["routes"]["vectors"] = {"primary": "vectors"}
    gw = await start(raw)
    answer = await claude(gw).messages.create(model="chat", max_tokens=8, messages=ASK)
    assert answer.content and answer.stop_reason == "end_turn"
    with pytest.raises(anthropic.BadRequestError) as refused:
        await claude(gw).messages.create(model="vectors", max_tokens=8, messages=ASK)
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "/v1/messages" in refused.value.message
    assert engine(gw, "vectors").records == {}
    await assert_idle(gw)
