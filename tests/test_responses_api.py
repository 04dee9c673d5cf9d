"""/v1/responses with the official `openai` SDK: translated to chat completions over
simulated engines (answers, streams, a tool round trip, what needs server state refused),
and passed through as it is to an engine that serves the Responses API itself."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from router.app import RunningGateway
from tests.support import (
    SdkClients,
    StartGateway,
    assert_idle,
    closed_port,
    engine,
    gateway_config,
    sim_backend,
)
from tests.support.responses import NATIVE_TEXT, WEATHER, WEATHER_INPUT, ResponsesEngine

TEXT = "the quick brown fox jumps over a lazy "  # the simulated engine's 8 tokens


@pytest.fixture
async def native() -> AsyncIterator[ResponsesEngine]:
    served = ResponsesEngine()
    yield served
    served.release()
    await served.close()


async def passing(start: StartGateway, native: ResponsesEngine,
                  stored: bool = False) -> RunningGateway:
    url = await native.start()
    config = gateway_config({"url": url, "model": "m", "slots": 1,
                             "apis": ["chat", "responses"]})
    config["routes"]["chat"]["responses"] = {"stored": stored}
    return await start(config)


def last(gw: RunningGateway) -> Any:
    return gw.gateway.recent[-1]


async def test_create_is_translated(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=2)))
    raw = await sdk(gw).responses.with_raw_response.create(
        model="chat", input="tell me something", instructions="be brief",
        max_output_tokens=100, metadata={"k": "v"}, temperature=0.5)
    response = raw.parse()
    assert response.object == "response" and response.status == "completed"
    assert response.id.startswith("resp_") and response.model == "chat"
    assert response.output_text == TEXT
    [item] = response.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    assert response.usage is not None and response.usage.output_tokens == 8
    assert response.usage.total_tokens == response.usage.input_tokens + 8
    assert response.metadata == {"k": "v"} and response.instructions == "be brief"
    assert raw.headers["x-slotgate-backend"] == "big"
    [asked] = engine(gw).records.values()
    assert asked.completed and not asked.stream
    rec = last(gw)
    assert rec.api == "responses" and rec.completion_tokens == 8 and not rec.tokens_estimated
    cut = await sdk(gw).responses.create(model="chat", input="hi", max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens" and cut.output_text == TEXT[:16]
    await assert_idle(gw)


async def test_stream_tells_the_same_response(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=2)))
    stream = await sdk(gw).responses.create(model="chat", input="tell me something",
                                            stream=True)
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == TEXT and len(deltas) == 8
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == TEXT
    assert final.usage is not None and final.usage.output_tokens == 8
    async with sdk(gw).responses.stream(model="chat", input="again") as helper:
        async for _ in helper:
            pass
        assert (await helper.get_final_response()).output_text == TEXT
    await assert_idle(gw)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_round_trip(sdk: SdkClients, start: StartGateway, stream: bool) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=2)))
    client = sdk(gw)
    asked: Any = [{"role": "user", "content": "what is the weather in x?"}]

    async def ask(items: Any) -> Any:
        if not stream:
            return await client.responses.create(model="chat", input=items, tools=[WEATHER])
        async with client.responses.stream(model="chat", input=items,
                                           tools=[WEATHER]) as s:
            return await s.get_final_response()

    call = await ask(asked)
    [item] = call.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert json.loads(item.arguments) == WEATHER_INPUT and item.call_id
    answered = await ask([*asked, {"type": "function_call", "call_id": item.call_id,
                                   "name": item.name, "arguments": item.arguments},
                          {"type": "function_call_output", "call_id": item.call_id,
                           "output": "sunny, 21 degrees"}])
    assert answered.output[0].type == "message" and answered.output_text
    await assert_idle(gw)


@pytest.mark.parametrize(("extra", "param"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"store": True}, "store"),
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
])
async def test_what_needs_server_state_is_refused(sdk: SdkClients, start: StartGateway,
                                                  extra: dict[str, Any], param: str) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    kwargs: Any = {"model": "chat", "input": "hi", **extra}
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk(gw).responses.create(**kwargs)
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert engine(gw).records == {}
    await assert_idle(gw)


async def test_store_false_and_unset_are_served(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    answer = await sdk(gw).responses.create(model="chat", input="hi", store=False)
    assert answer.output_text == TEXT
    await assert_idle(gw)


async def test_passed_through_as_it_is(sdk: SdkClients, start: StartGateway,
                                       native: ResponsesEngine) -> None:
    gw = await passing(start, native, stored=True)  # the route lets the engine keep them
    raw = await sdk(gw).responses.with_raw_response.create(
        model="chat", input="hi", previous_response_id="resp_0", store=True,
        tools=[{"type": "web_search"}])
    assert raw.parse().output_text == NATIVE_TEXT
    assert raw.headers["x-slotgate-backend"] == "big"
    [body] = native.bodies
    assert body == {"model": "m", "input": "hi", "previous_response_id": "resp_0",
                    "store": True, "tools": [{"type": "web_search"}]}
    rec = last(gw)
    assert rec.api == "responses" and rec.endpoint == "/v1/responses"
    assert (rec.prompt_tokens, rec.completion_tokens) == (11, 3) and not rec.tokens_estimated
    await assert_idle(gw)


async def test_a_passed_through_answer_without_usage_is_estimated(
        sdk: SdkClients, start: StartGateway, native: ResponsesEngine) -> None:
    gw = await passing(start, native)
    native.with_usage = False
    answer = await sdk(gw).responses.create(model="chat", input="hi there")
    assert answer.output_text == NATIVE_TEXT
    rec = last(gw)
    assert rec.tokens_estimated and rec.prompt_tokens > 0 and rec.completion_tokens > 0
    await assert_idle(gw)


async def test_passed_through_stream_is_relayed(sdk: SdkClients, start: StartGateway,
                                                native: ResponsesEngine) -> None:
    gw = await passing(start, native)
    stream = await sdk(gw).responses.create(model="chat", input="hi", stream=True)
    events = [event async for event in stream]
    assert [e.sequence_number for e in events] == list(range(5))
    assert events[-1].type == "response.completed"
    [body] = native.bodies
    # no stream_options added; `store: false` said (stored responses are off on the route)
    assert body == {"model": "m", "input": "hi", "stream": True, "store": False}
    rec = last(gw)
    assert rec.stream and (rec.prompt_tokens, rec.completion_tokens) == (11, 3)
    await assert_idle(gw)


async def test_a_backend_without_chat_or_responses_is_refused(
        sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1, apis=["embeddings"])))
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk(gw).responses.create(model="chat", input="hi")
    assert refused.value.code == "unsupported_api"
    await assert_idle(gw)


async def test_unknown_model_is_404(sdk: SdkClients, start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    with pytest.raises(openai.NotFoundError):
        await sdk(gw).responses.create(model="nope", input="hi")


async def test_passed_through_moves_only_to_a_backend_that_serves_it(
        sdk: SdkClients, start: StartGateway, native: ResponsesEngine) -> None:
    url = await native.start()
    down = {"url": f"http://127.0.0.1:{closed_port()}/v1", "model": "m", "slots": 1,
            "apis": ["chat", "responses"]}
    gw = await start(gateway_config(down, {"url": url, "model": "m", "slots": 1,
                                           "apis": ["chat", "responses"]}))
    raw = await sdk(gw).responses.with_raw_response.create(model="chat", input="hi")
    assert raw.headers["x-slotgate-backend"] == "small"  # retried before its first byte
    assert raw.parse().output_text == NATIVE_TEXT
    await assert_idle(gw)
    chat_only = await start(gateway_config(down, sim_backend("s", slots=1)))
    with pytest.raises(openai.APIStatusError) as failed:
        await sdk(chat_only).responses.create(model="chat", input="hi")
    assert failed.value.status_code >= 500
    assert engine(chat_only, "small").records == {}  # a chat-only engine never saw it
    await assert_idle(chat_only)
