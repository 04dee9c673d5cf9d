"""The simulated engine's tool calls, through the official `openai` SDK: a call of the
first shell (else the first, or the named) tool with arguments from its schema, streamed as
tool_call deltas, and text instead with `tool_choice: none` or once the turn holds a result;
its `stop` strings and prompt token counts."""

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


SHELL: Any = {"type": "function", "function": {"name": "Bash", "parameters": {
    "type": "object", "required": ["command"], "properties": {"command": {"type": "string"}}}}}
CALL: Any = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}]}


async def test_an_agent_loop_ends_after_one_round_trip(client: openai.AsyncOpenAI) -> None:
    """The shell is picked over the first tool, with a harmless command; a result followed by
    a system turn and the client's own text (Claude Code's reminders) ends in text; a new
    prompt after the text answer calls again."""
    first = await client.chat.completions.create(model="m", messages=ASK, tools=[*TOOLS, SHELL])
    [call] = first.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "Bash"
    assert orjson.loads(call.function.arguments) == {"command": "echo slotgate-simulated"}
    history: Any = [*ASK, {"role": "system", "content": "agent types"}, CALL,
                    {"role": "tool", "tool_call_id": "c1", "content": "slotgate-simulated"},
                    {"role": "user", "content": "<system-reminder>...</system-reminder>"}]
    done = await client.chat.completions.create(model="m", messages=history, tools=[SHELL])
    assert done.choices[0].finish_reason == "stop" and done.choices[0].message.content
    again = [*history, {"role": "assistant", "content": "done"}, *ASK]
    more = await client.chat.completions.create(model="m", messages=again, tools=[SHELL])
    assert more.choices[0].finish_reason == "tool_calls"


def test_a_command_as_an_argv_array() -> None:
    schema = {"required": ["command"], "properties": {"command": {"type": "array"}}}
    assert arguments(schema) == {"command": ["bash", "-lc", "echo slotgate-simulated"]}
    assert arguments({"required": ["cmd"], "properties": {"cmd": {"type": "string"}}}) == {
        "cmd": "echo slotgate-simulated"}


async def test_tools_and_calls_count_as_prompt_tokens(client: openai.AsyncOpenAI) -> None:
    plain = await client.chat.completions.create(model="m", messages=ASK)
    with_tools = await client.chat.completions.create(model="m", messages=ASK, tools=TOOLS,
                                                      tool_choice="none")
    assert plain.usage and with_tools.usage
    assert with_tools.usage.prompt_tokens == plain.usage.prompt_tokens + len(
        orjson.dumps(TOOLS)) // 4


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_cuts_the_text_before_the_match(client: openai.AsyncOpenAI,
                                                   stream: bool) -> None:
    if not stream:
        answer = await client.chat.completions.create(model="m", messages=ASK,
                                                      stop=["xyz", "own f"])
        choice = answer.choices[0]
        assert (choice.message.content, choice.finish_reason) == ("the quick br", "stop")
        assert choice.model_dump()["stop_reason"] == "own f"
        assert answer.usage and answer.usage.completion_tokens == 3
        return
    chunks = [c async for c in await client.chat.completions.create(
        model="m", messages=ASK, stop="fox", stream=True)]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "the quick brown "
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices[0].model_dump()["stop_reason"] == "fox"


async def test_an_engine_that_never_calls_tools_answers_in_text() -> None:
    running: RunningSim = await start_simulator(
        FAST.model_copy(update={"tool_calls": "never"}), "sim-model")
    try:
        async with openai.AsyncOpenAI(base_url=running.url + "/v1", api_key="x",
                                      max_retries=0) as sdk:
            answer = await sdk.chat.completions.create(model="m", messages=ASK, tools=TOOLS)
        assert answer.choices[0].finish_reason in ("stop", "length")
        assert answer.choices[0].message.tool_calls is None
        assert answer.choices[0].message.content
    finally:
        await running.close()
