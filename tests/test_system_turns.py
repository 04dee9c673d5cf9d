"""System turns inside `messages`, as Claude Code sends them (the mid-conversation-system
beta: `{"role": "system", ...}` after the prompt), through a real gateway to a recording
engine: each stays at its place by default, and a backend with `system_messages: fold`
gets one leading system message instead (for chat templates that allow no other)."""

from __future__ import annotations

import logging
from typing import Any

import anthropic
import orjson
import pytest
from aiohttp import web

from tests.support import StartGateway, assert_idle
from tests.support.anthropic import AnthropicClients

SYSTEM_TURN = {"role": "system", "content": "Available agent types for the Agent tool: ..."}
MESSAGES: list[Any] = [
    {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"},
                                 {"type": "text", "text": "say hello"}]},
    SYSTEM_TURN,
]


def _engine(seen: list[dict[str, Any]]) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        message = {"role": "assistant", "content": "hello"}
        usage: dict[str, Any] = {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}
        if not body.get("stream"):
            return web.json_response({"id": "c", "object": "chat.completion", "created": 0,
                                      "model": body["model"], "usage": usage, "choices": [
                                          {"index": 0, "message": message,
                                           "finish_reason": "stop"}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunks: tuple[dict[str, Any], ...] = (
            {"choices": [{"index": 0, "delta": message, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": usage})
        for chunk in chunks:
            whole = {"id": "c", "object": "chat.completion.chunk", "created": 0,
                     "model": body["model"], **chunk}
            await response.write(b"data: " + orjson.dumps(whole) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def _gateway(aiohttp_server: Any, start: StartGateway, seen: list[dict[str, Any]],
                   **backend: Any) -> Any:
    engine = await aiohttp_server(_engine(seen))
    return await start({"backends": {"big": {"url": str(engine.make_url("/v1")), "model": "m",
                                              "slots": 2, **backend}},
                        "routes": {"llama-70b": {"primary": "big"}}})


@pytest.mark.parametrize("stream", [False, True])
async def test_a_system_turn_is_served_at_its_place(
    aiohttp_server: Any, claude: AnthropicClients, start: StartGateway, stream: bool,
) -> None:
    seen: list[dict[str, Any]] = []
    gw = await _gateway(aiohttp_server, start, seen)
    client = claude(gw)
    kwargs: dict[str, Any] = dict(model="llama-70b", max_tokens=64, system="You are terse.",
                                  messages=MESSAGES,
                                  extra_headers={"anthropic-beta":
                                                 "mid-conversation-system-2026-04-07"})
    if stream:
        async with client.messages.stream(**kwargs) as events:
            reply = await events.get_final_message()
    else:
        reply = await client.messages.create(**kwargs)
    assert reply.content[0].type == "text" and reply.content[0].text == "hello"
    roles = [m["role"] for m in seen[0]["messages"]]
    assert roles == ["system", "user", "system"]
    assert seen[0]["messages"][2]["content"] == SYSTEM_TURN["content"]
    await assert_idle(gw)


async def test_a_backend_may_fold_system_turns_into_one(
    aiohttp_server: Any, claude: AnthropicClients, start: StartGateway,
) -> None:
    seen: list[dict[str, Any]] = []
    gw = await _gateway(aiohttp_server, start, seen, system_messages="fold")
    await claude(gw).messages.create(model="llama-70b", max_tokens=64, system="You are terse.",
                                     messages=MESSAGES)
    messages = seen[0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == "You are terse.\n\n" + SYSTEM_TURN["content"]
    await assert_idle(gw)


async def test_a_system_turn_that_is_not_text_is_refused_in_anthropics_shape(
    aiohttp_server: Any, claude: AnthropicClients, start: StartGateway,
) -> None:
    seen: list[dict[str, Any]] = []
    gw = await _gateway(aiohttp_server, start, seen)
    with pytest.raises(anthropic.BadRequestError) as refused:
        not_text: Any = {"role": "system", "content": [{"type": "image"}]}
        await claude(gw).messages.create(model="llama-70b", max_tokens=64,
                                         messages=[MESSAGES[0], not_text])
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "messages.1.content.0" in refused.value.message
    assert seen == []
    await assert_idle(gw)


async def test_refusals_are_logged_with_code_route_and_field(
    aiohttp_server: Any, claude: AnthropicClients, start: StartGateway,
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[dict[str, Any]] = []
    gw = await _gateway(aiohttp_server, start, seen)
    caplog.set_level(logging.INFO, "slotgate.access")
    document: Any = {"role": "user", "content": [{"type": "document", "source": {}}]}
    for model in ("llama-70b", "nope"):
        with pytest.raises(anthropic.BadRequestError):
            await claude(gw).messages.create(model=model, max_tokens=64, messages=[document])
    with pytest.raises(anthropic.NotFoundError):
        await claude(gw).messages.create(model="nope", max_tokens=64, messages=MESSAGES)
    lines = [orjson.loads(r.getMessage()) for r in caplog.records
             if r.name == "slotgate.access"]
    assert [(line["status"], line["error"], line["route"], line["param"]) for line in lines] == [
        (400, "invalid_request_error", "llama-70b", "messages"),  # the route it named
        (400, "invalid_request_error", None, "messages"),  # no such route: none logged
        (404, "model_not_found", None, "model")]
    assert seen == []
    await assert_idle(gw)
