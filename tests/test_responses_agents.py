"""/v1/responses as Codex speaks it, with the official `openai` SDK against a gateway on
loopback: namespace tools flattened and their calls given back under the namespace,
custom (free-form) tools, hosted tools dropped and named (header, access log) or refused
per route, Codex's other fields served; a passed-through request keeps nothing on the
shared engine account unless the route allows it; the WebSocket mode declined with 426
(Codex's signal to use HTTP at once), every attempt in the access log."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from router.app import RunningGateway
from tests.support import (
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    serve_app,
    sim_backend,
)
from tests.support.responses import NATIVE_TEXT, ResponsesEngine

SPAWN: Any = {"type": "function", "name": "spawn_agent", "description": "Start a sub-agent.",
              "strict": False,
              "parameters": {"type": "object", "required": ["message"],
                             "properties": {"message": {"type": "string"}}}}
MULTI_AGENT: Any = {"type": "namespace", "name": "multi_agent_v1",
                    "description": "Tools in the multi_agent_v1 namespace.", "tools": [SPAWN]}
EXEC: Any = {"type": "function", "name": "exec_command", "description": "Run a command.",
             "strict": False, "parameters": {"type": "object", "required": ["cmd"],
                                             "properties": {"cmd": {"type": "string"}}}}
# A tool that is no shell: with no shell offered the simulated engine calls the first tool.
VIEW_IMAGE: Any = {"type": "function", "name": "view_image", "description": "Show an image.",
                   "strict": False, "parameters": {"type": "object", "required": ["path"],
                                                   "properties": {"path": {"type": "string"}}}}
APPLY_PATCH: Any = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
                    "format": {"type": "grammar", "syntax": "lark",
                               "definition": "start: \"*** Begin Patch\" /(.|\\n)*/"}}
HOSTED: Any = [{"type": "web_search", "external_web_access": False},
               {"type": "image_generation", "output_format": "png"}]
# What Codex 0.171 sends besides `input` and `tools` (its request body, less the prompts;
# `text.verbosity` it adds for models that have it).
CODEX_FIELDS: Any = {
    "instructions": "You are a coding agent.", "tool_choice": "auto",
    "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
    "store": False, "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "01a237e7-20aa", "text": {"verbosity": "medium"},
    # not a parameter of the SDK's: sent as Codex does, in the body
    "extra_body": {"client_metadata": {"session_id": "01a237e7-20aa",
                                       "turn_id": "01a237e7-20c7"}},
}
USER: Any = [{"type": "message", "id": "msg_1", "role": "developer",
              "content": [{"type": "input_text", "text": "<permissions>...</permissions>"}]},
             {"type": "message", "id": "msg_2", "role": "user",
              "content": [{"type": "input_text", "text": "say hello"}]}]


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "slotgate.access"]


def codex(tools: list[Any], **extra: Any) -> dict[str, Any]:
    return {"model": "chat", "input": USER, "tools": tools, **CODEX_FIELDS, **extra}


@pytest.mark.parametrize("stream", [False, True])
async def test_codex_request_is_served_and_the_namespaced_call_comes_back(
        sdk: SdkClients, start: StartGateway, caplog: pytest.LogCaptureFixture,
        stream: bool) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    client = sdk(gw)
    asked = codex([MULTI_AGENT, VIEW_IMAGE, *HOSTED])  # the engine calls its first tool
    with caplog.at_level(logging.INFO, logger="slotgate.access"):
        if stream:
            async with client.responses.with_streaming_response.create(
                    **asked, stream=True) as raw:
                headers = raw.headers
                events = [event async for event in await raw.parse()]
            done = [e.item for e in events if e.type == "response.output_item.done"]
            assert events[-1].type == "response.completed"
            assert events[-1].response.output == done  # the same items, whole
            [call] = done
        else:
            raw_answer = await client.responses.with_raw_response.create(**asked)
            headers = raw_answer.headers
            [call] = raw_answer.parse().output
    assert headers["x-slotgate-dropped-tools"] == "web_search,image_generation"
    assert call.type == "function_call" and call.status == "completed"
    assert (call.namespace, call.name) == ("multi_agent_v1", "spawn_agent")
    assert json.loads(call.arguments) == {"message": "x"}
    [line] = access_lines(caplog)
    assert line["status"] == 200 and line["dropped_tools"] == "web_search,image_generation"

    # The round trip, as Codex sends it: the call back (namespace and all), its output.
    answered = await client.responses.create(**codex(
        [MULTI_AGENT, EXEC, *HOSTED],
        input=[*USER, {"type": "reasoning", "summary": [], "encrypted_content": None},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "namespace": call.namespace, "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id,
                "output": "agent started"}]))
    assert answered.output[0].type == "message" and answered.output_text
    await assert_idle(gw)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_custom_tool_call_comes_back_with_its_input(
        sdk: SdkClients, start: StartGateway, stream: bool) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    client = sdk(gw)
    asked = codex([APPLY_PATCH, VIEW_IMAGE])
    if stream:
        events = [e async for e in await client.responses.create(**asked, stream=True)]
        kinds = [e.type for e in events]
        assert "response.custom_tool_call_input.done" in kinds
        assert "response.function_call_arguments.delta" not in kinds
        [call] = events[-1].response.output
    else:
        [call] = (await client.responses.create(**asked)).output
    assert call.type == "custom_tool_call" and call.name == "apply_patch"
    assert call.input == "x"  # the simulated engine's value for a required string
    answered = await client.responses.create(**codex(
        [APPLY_PATCH, EXEC],
        input=[*USER, {"type": "custom_tool_call", "call_id": call.call_id,
                       "name": "apply_patch", "input": call.input},
               {"type": "custom_tool_call_output", "call_id": call.call_id,
                "output": "Success. Updated the following files: a.py"}]))
    assert answered.output_text
    await assert_idle(gw)


async def test_the_engine_sees_flat_function_tools_only(
        sdk: SdkClients, start: StartGateway) -> None:
    seen: list[dict[str, Any]] = []

    async def chat(request: web.Request) -> web.Response:
        seen.append(await request.json())
        return web.json_response({
            "id": "c", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "hello"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner, url = await serve_app(app)
    try:
        gw = await start(gateway_config({"url": url + "/v1", "model": "m", "slots": 1}))
        answer = await sdk(gw).responses.create(**codex([MULTI_AGENT, *HOSTED, APPLY_PATCH]))
        assert answer.output_text == "hello"
    finally:
        await runner.cleanup()
    [body] = seen
    assert [(t["type"], t["function"]["name"]) for t in body["tools"]] == [
        ("function", "multi_agent_v1__spawn_agent"), ("function", "apply_patch")]
    assert body["tools"][1]["function"]["parameters"]["required"] == ["input"]
    assert "lark grammar" in body["tools"][1]["function"]["description"]
    assert body["messages"][0] == {"role": "system", "content": "You are a coding agent."}
    assert body["tool_choice"] == "auto" and body["parallel_tool_calls"] is True
    for field in ("reasoning", "include", "store", "prompt_cache_key", "text",
                  "client_metadata"):
        assert field not in body
    await assert_idle(gw)


async def test_a_route_may_refuse_hosted_tools(sdk: SdkClients, start: StartGateway,
                                               caplog: pytest.LogCaptureFixture) -> None:
    config = gateway_config(sim_backend("m", slots=1))
    config["routes"]["chat"]["responses"] = {"hosted_tools": "refuse"}
    gw = await start(config)
    with caplog.at_level(logging.INFO, logger="slotgate.access"), \
            pytest.raises(openai.BadRequestError) as refused:
        await sdk(gw).responses.create(**codex([EXEC, *HOSTED]))
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == "tools"
    assert "'tools[1]': 'web_search'" in error["message"]
    assert engine(gw).records == {}
    [line] = access_lines(caplog)
    assert line["status"] == 400 and line["dropped_tools"] is None
    # Function and namespace tools alone are served on that route.
    [call] = (await sdk(gw).responses.create(**codex([MULTI_AGENT]))).output
    assert call.namespace == "multi_agent_v1"
    await assert_idle(gw)


# -- passed through to an engine that serves the Responses API ------------------------------

@pytest.fixture
async def native() -> AsyncIterator[ResponsesEngine]:
    served = ResponsesEngine()
    yield served
    served.release()
    await served.close()


async def passing(start: StartGateway, native: ResponsesEngine,
                  responses: dict[str, Any] | None = None) -> RunningGateway:
    url = await native.start()
    config = gateway_config({"url": url, "model": "m", "slots": 1,
                             "apis": ["chat", "responses"]})
    if responses is not None:
        config["routes"]["chat"]["responses"] = responses
    return await start(config)


async def test_a_passed_through_request_stores_nothing_by_default(
        sdk: SdkClients, start: StartGateway, native: ResponsesEngine) -> None:
    gw = await passing(start, native)
    raw = await sdk(gw).responses.with_raw_response.create(
        model="chat", input="hi", store=True, tools=[{"type": "web_search"}])
    assert raw.parse().output_text == NATIVE_TEXT
    assert "x-slotgate-dropped-tools" not in raw.headers  # the engine runs what it can
    answered = await sdk(gw).responses.create(model="chat", input="hi")  # store unset
    assert answered.output_text == NATIVE_TEXT
    assert [body.get("store") for body in native.bodies] == [False, False]
    assert native.bodies[0]["tools"] == [{"type": "web_search"}]
    for param, value in (("previous_response_id", "resp_0"), ("conversation", "conv_1")):
        kwargs: Any = {"model": "chat", "input": "hi", param: value}
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk(gw).responses.create(**kwargs)
        error = refused.value.body
        assert isinstance(error, dict)
        assert error["type"] == "invalid_request_error" and error["param"] == param
        assert "shared by every tenant" in error["message"]
    assert len(native.bodies) == 2  # the refused ones never reached the engine
    await assert_idle(gw)


async def test_a_route_may_let_the_engine_keep_responses(
        sdk: SdkClients, start: StartGateway, native: ResponsesEngine) -> None:
    gw = await passing(start, native, {"stored": True})
    await sdk(gw).responses.create(model="chat", input="hi", store=True,
                                   previous_response_id="resp_0")
    [body] = native.bodies
    assert body["store"] is True and body["previous_response_id"] == "resp_0"
    await assert_idle(gw)


# -- the WebSocket mode -----------------------------------------------------------------------

# The handshake headers Codex sends (codex-rs: build_websocket_headers), secrets aside.
CODEX_SOCKET_HEADERS = {"OpenAI-Beta": "responses_websockets=2026-02-06",
                        "session_id": "0199a1b2-c3d4", "originator": "codex_exec",
                        "version": "0.171.0"}


async def test_the_websocket_mode_is_declined_with_426_and_logged(
        start: StartGateway, caplog: pytest.LogCaptureFixture) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    async with aiohttp.ClientSession() as session:
        with caplog.at_level(logging.INFO, logger="slotgate.access"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as declined:
                await session.ws_connect(gw.url + "/v1/responses",
                                         headers=CODEX_SOCKET_HEADERS)
            async with session.get(gw.url + "/v1/responses") as plain:
                assert plain.status == 405 and plain.headers["Allow"] == "POST"
                assert (await plain.json())["error"]["code"] == "method_not_allowed"
    assert declined.value.status == 426  # Codex: use HTTP now, for the whole session
    assert declined.value.headers is not None
    assert declined.value.headers["x-should-retry"] == "false"
    lines = access_lines(caplog)
    assert [(x["endpoint"], x["api"], x["status"], x["error"]) for x in lines] == [
        ("/v1/responses", "responses", 426, "websocket_not_supported"),
        ("/v1/responses", "responses", 405, "method_not_allowed")]
    assert engine(gw).records == {}
    await assert_idle(gw)


async def test_a_websocket_attempt_with_a_wrong_key_is_401(
        start: StartGateway, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = gateway_config(sim_backend("m", slots=1))
    config["auth"] = {"enabled": True, "keys": [
        {"id": "dev", "tenant": "t", "key_env": "SLOTGATE_CODEX_KEY"}]}
    monkeypatch.setenv("SLOTGATE_CODEX_KEY", "sk-right")
    gw = await start(config)
    async with aiohttp.ClientSession() as session:
        with caplog.at_level(logging.INFO, logger="slotgate.access"):
            with pytest.raises(aiohttp.WSServerHandshakeError) as wrong:
                await session.ws_connect(gw.url + "/v1/responses", headers={
                    **CODEX_SOCKET_HEADERS, "Authorization": "Bearer sk-wrong"})
            with pytest.raises(aiohttp.WSServerHandshakeError) as right:
                await session.ws_connect(gw.url + "/v1/responses", headers={
                    **CODEX_SOCKET_HEADERS, "Authorization": "Bearer sk-right"})
    assert (wrong.value.status, right.value.status) == (401, 426)
    assert [x["status"] for x in access_lines(caplog)] == [401, 426]
    assert access_lines(caplog)[1]["tenant"] == "t"
    await assert_idle(gw)
