"""The simulated engine's tool calls, through the official `openai` SDK: a call of the
first (or the named) tool with arguments from its schema, streamed as tool_call deltas,
and text instead with `tool_choice: none` or once the conversation ends with a result."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest

from policies.config import SimulatedSpec
from router.upstream.simulated.app import RunningSim, start_simulator
from router.upstream.simulated.tools import arguments, pieces

FAST = SimulatedSpec(max_num_seqs=2, ttft_s=0, tokens_per_s=0, output_tokens=5)
ASK: Any = [{"role": "user", "content": "weather?"}]
TOOLS: Any = [
    {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "required": ["city", "days"],
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "time", "parameters": {"type": "object"}}},
]


@pytest.fixture
async def client() -> AsyncIterator[openai.AsyncOpenAI]:
    running: RunningSim = await start_simulator(FAST, "sim-model")
    async with openai.AsyncOpenAI(base_url=running.url + "/v1", api_key="x",
                                  max_retries=0) as sdk:
        yield sdk
    await running.engine.wait_until(lambda e: e.active == 0, timeout=2)
    await running.close()


def test_arguments_come_from_the_required_properties() -> None:
    assert arguments(TOOLS[0]["function"]["parameters"]) == {"city": "x", "days": 1}
    assert arguments({"required": ["u"], "properties": {"u": {"enum": ["c", "f"]}}}) == {
        "u": "c"}
    assert arguments({"required": "u"}) == {} and arguments(None) == {}
    assert "".join(pieces('{"city":"x"}', 5)) == '{"city":"x"}'
    assert len(pieces("{}", 5)) == 2


async def test_a_call_of_the_first_tool(client: openai.AsyncOpenAI) -> None:
    answer = await client.chat.completions.create(model="m", messages=ASK, tools=TOOLS)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "weather"
    assert orjson.loads(call.function.arguments) == {"city": "x", "days": 1}


async def test_a_streamed_call_builds_the_same_arguments(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, stream=True,
        tool_choice={"type": "function", "function": {"name": "time"}})
    chunks = [c async for c in stream]
    deltas = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or ()]
    assert deltas[0].id and deltas[0].function and deltas[0].function.name == "time"
    assert "".join(d.function.arguments or "" for d in deltas if d.function) == "{}"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(("extra", "calls"), [
    ({"tool_choice": "none"}, False),
    ({"tool_choice": "auto"}, False),  # after a tool result: the answer
    ({"tool_choice": "required"}, True),
])
async def test_after_a_tool_result(client: openai.AsyncOpenAI, extra: dict[str, Any],
                                   calls: bool) -> None:
    history: Any = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    answer = await client.chat.completions.create(model="m", messages=history, tools=TOOLS,
                                                  **extra)
    choice = answer.choices[0]
    assert (choice.finish_reason == "tool_calls") is calls
    assert bool(choice.message.tool_calls) is calls and bool(choice.message.content) is not calls


async def test_max_tokens_cuts_a_call(client: openai.AsyncOpenAI) -> None:
    answer = await client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                                  max_tokens=2)
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and answer.usage is not None
    assert answer.usage.completion_tokens == 2
