"""The Responses API's translations, without a gateway: request tables, what is refused,
and properties: conversations and answers round-trip, a stream in any chunking builds the
whole answer's response."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from router.apis.responses_answer import Echo, to_response
from router.apis.responses_request import to_chat
from router.apis.responses_stream import ResponseStream
from router.apis.responses_tools import Called, Unsupported, chat_tools, tool_names
from router.common.usage import Usage
from tests.support.responses import (
    WEATHER,
    accumulate,
    chat_of_response,
    parse_stream,
    responses_of,
)

ECHO = Echo("resp_1", "chat", 1700000000)
EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)  # the SDK's own event types


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "chat", **fields}


@pytest.mark.parametrize(("fields", "expected"), [
    ({"input": "hi"}, chat(messages=[{"role": "user", "content": "hi"}])),
    ({"input": "hi", "instructions": "be brief", "max_output_tokens": 9, "temperature": 0.2,
      "top_p": 0.9, "user": "u", "metadata": {"k": "v"}, "stream": True, "store": False},
     chat(messages=[{"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hi"}],
          max_tokens=9, temperature=0.2, top_p=0.9, user="u", stream=True)),
    ({"input": "hi", "tools": [WEATHER], "tool_choice": "required"},
     chat(messages=[{"role": "user", "content": "hi"}], tool_choice="required",
          tools=[{"type": "function", "function": {
              "name": "get_weather", "description": WEATHER["description"],
              "parameters": WEATHER["parameters"]}}])),
    ({"input": "hi", "tool_choice": {"type": "function", "name": "f"}},
     chat(messages=[{"role": "user", "content": "hi"}],
          tool_choice={"type": "function", "function": {"name": "f"}})),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "n",
                                         "schema": {"type": "object"}}}},
     chat(messages=[{"role": "user", "content": "hi"}], response_format={
         "type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}})),
])
def test_request_fields(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    assert to_chat({"model": "chat", **fields}).body == expected


@pytest.mark.parametrize(("items", "expected"), [
    ([{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"}]}],
     [{"role": "user", "content": [
         {"type": "text", "text": "look"},
         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA",
                                             "detail": "low"}}]}]),
    ([{"role": "developer", "content": "rules"}, {"role": "user", "content": "hi"}],
     [{"role": "system", "content": "rules"}, {"role": "user", "content": "hi"}]),
    ([{"role": "assistant", "content": [{"type": "output_text", "text": "a"},
                                        {"type": "output_text", "text": "b"}]}],
     [{"role": "assistant", "content": "ab"}]),
    ([{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
      {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\":1}"},
      {"type": "function_call_output", "call_id": "c1", "output": "one"},
      {"type": "function_call_output", "call_id": "c2",
       "output": [{"type": "input_text", "text": "two"}]}],
     [{"role": "assistant", "content": None, "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
         {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{\"x\":1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "one"},
      {"role": "tool", "tool_call_id": "c2", "content": "two"}]),
    ([{"type": "reasoning", "id": "rs_1", "summary": []}, {"role": "user", "content": "hi"}],
     [{"role": "user", "content": "hi"}]),
])
def test_input_items(items: Any, expected: Any) -> None:
    assert to_chat({"model": "chat", "input": items}).body["messages"] == expected


def test_reasoning_to_carry_is_no_server_data() -> None:
    """Codex asks for its reasoning back with store: false; a chat engine has none."""
    asked = {"model": "chat", "input": "hi", "store": False,
             "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "low"}}
    assert to_chat(asked).body == chat(messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(("fields", "param"), [
    ({"previous_response_id": "resp_0"}, "previous_response_id"),
    ({"store": True}, "store"),
    ({"background": True}, "background"),
    ({"conversation": {"id": "conv_1"}}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"include": ["reasoning.encrypted_content", "web_search_call.action.sources"]},
     "include"),
    ({"include": "x"}, "include"),
    ({"tools": [{"type": "hosted_by_nobody"}]}, "tools"),
    ({"tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "mcp"}]}]}, "tools"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": [{"type": "item_reference", "id": "msg_0"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "input"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input"),
    ({"input": [{"role": {}, "content": "x"}]}, "input"),  # unhashable: no 500
    ({"input": [{"role": "user", "content": [{"type": {}, "text": "x"}]}]}, "input"),
    ({"input": [{"type": {}, "content": "x"}]}, "input"),
    ({"input": 7}, "input"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"instructions": ["x"]}, "instructions"),
    ({"text": {"format": {"type": "grammar"}}}, "text"),
])
def test_what_is_refused(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(Unsupported) as refused:
        to_chat({"model": "chat", "input": "hi", **fields})
    assert refused.value.param == param


# -- properties -----------------------------------------------------------------------------

texts = st.text(max_size=40)
names = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
ids = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=10).map(
    lambda s: "call_" + s)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=6)
arguments = st.dictionaries(names, json_values, max_size=4)


@st.composite
def calls(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(st.integers(0, 3))
    call_ids = draw(st.lists(ids, min_size=count, max_size=count, unique=True))
    return [{"id": i, "type": "function", "function": {
        "name": draw(names), "arguments": orjson.dumps(draw(arguments)).decode()}}
        for i in call_ids]


@st.composite
def conversations(draw: st.DrawFn) -> dict[str, Any]:
    """A chat request of the shapes the Responses API can say: instructions, user turns,
    assistant turns with text and function calls, each call answered by its output."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        # (empty instructions say nothing: no system message)
        messages.append({"role": "system", "content": draw(st.text(min_size=1, max_size=40))})
    for _ in range(draw(st.integers(1, 4))):
        messages.append({"role": "user", "content": draw(texts)})
        made = draw(calls())
        text = draw(st.none() | texts) if made else draw(texts)
        assistant: dict[str, Any] = {"role": "assistant", "content": text}
        if made:
            assistant["tool_calls"] = made
        messages.append(assistant)
        messages.extend({"role": "tool", "tool_call_id": c["id"], "content": draw(texts)}
                        for c in made)
    if messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": draw(texts)})
    out = {"model": "chat", "max_tokens": draw(st.integers(1, 4096)), "messages": messages}
    if draw(st.booleans()):
        out["user"] = draw(names)
    if draw(st.booleans()):
        out["stream"] = draw(st.booleans())
    return out


@settings(max_examples=200, deadline=None)
@given(conversations())
def test_a_conversation_round_trips(conversation: dict[str, Any]) -> None:
    assert to_chat(responses_of(conversation)).body == conversation


@st.composite
def completions(draw: st.DrawFn) -> dict[str, Any]:
    made = draw(calls())
    text = draw(st.none() | texts)
    finish = "tool_calls" if made else draw(st.sampled_from(["stop", "length"]))
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if made:
        message["tool_calls"] = made
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": draw(st.integers(0, 10**5)),
                      "completion_tokens": draw(st.integers(0, 10**5))}}


def _normal(completion: dict[str, Any]) -> dict[str, Any]:
    """What the round trip keeps: text, tool calls, finish, usage."""
    choice = completion["choices"][0]
    message = choice["message"]
    return {"text": message["content"] or "", "finish": choice["finish_reason"],
            "calls": [(c["id"], c["function"]["name"], c["function"]["arguments"])
                      for c in message.get("tool_calls", ())],
            "usage": (completion["usage"]["prompt_tokens"],
                      completion["usage"]["completion_tokens"])}


@settings(max_examples=200, deadline=None)
@given(completions())
def test_an_answer_round_trips(completion: dict[str, Any]) -> None:
    response = to_response(completion, ECHO)
    Response.model_validate(response)  # the SDK's type, validated (the SDK itself does not)
    assert response["object"] == "response" and response["model"] == "chat"
    usage = response["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert _normal(chat_of_response(response)) == _normal(completion)


def _chunks(completion: dict[str, Any], cuts: list[int]) -> bytes:
    """The completion as an engine streams it: text in pieces, each call's arguments in
    pieces, the finish, the usage chunk, [DONE]."""
    choice = completion["choices"][0]
    message, out = choice["message"], []

    def data(delta: dict[str, Any], finish: str | None = None) -> None:
        out.append(b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk",
                                             "choices": [{"index": 0, "delta": delta,
                                                          "finish_reason": finish}]}) + b"\n\n")

    data({"role": "assistant", "content": ""})
    for piece in _split(message["content"] or "", cuts):
        data({"content": piece})
    for i, call in enumerate(message.get("tool_calls", ())):
        function = call["function"]
        data({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                              "function": {"name": function["name"], "arguments": ""}}]})
        for piece in _split(function["arguments"], cuts):
            data({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    data({}, choice["finish_reason"])
    out.append(b"data: " + orjson.dumps({"choices": [], "usage": completion["usage"]}) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def _split(text: str, cuts: list[int]) -> list[str]:
    at = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(at) if b > a]


@settings(max_examples=200, deadline=None)
@given(completions(), st.lists(st.integers(0, 1000), max_size=6),
       st.lists(st.integers(1, 200), min_size=1, max_size=8))
def test_a_stream_builds_the_same_response(completion: dict[str, Any], cuts: list[int],
                                           sizes: list[int]) -> None:
    """Whatever the engine's chunking and the network's byte boundaries."""
    raw = _chunks(completion, cuts)
    usage = Usage()
    relay = ResponseStream(ECHO, usage, input_estimate=7)
    out, at, i = [], 0, 0
    while at < len(raw):
        size = sizes[i % len(sizes)]
        out.append(relay.feed(raw[at:at + size]))
        at, i = at + size, i + 1
    out.append(relay.flush())
    events = parse_stream(b"".join(out))
    for event in events:
        EVENT.validate_python(event)
    assert accumulate(events) == to_response(completion, ECHO)
    assert usage.known and usage.completion_tokens == completion["usage"]["completion_tokens"]


def test_a_stream_that_ends_without_done_still_ends() -> None:
    relay = ResponseStream(ECHO, Usage(), input_estimate=5)
    raw = (b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}'
           b"\n\n")
    events = parse_stream(relay.feed(raw) + relay.flush())
    final = accumulate(events)
    assert final["status"] == "completed"
    assert final["usage"]["input_tokens"] == 5 and final["usage"]["output_tokens"] == 1


# -- tools as Codex sends them ----------------------------------------------------------------

SPAWN = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}
PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}


def test_tools_are_flattened_and_hosted_ones_dropped() -> None:
    tools = [{"type": "namespace", "name": "mcp__srv__", "description": "",
              "tools": [SPAWN, {**PATCH, "name": "_edit"}]},
             {"type": "web_search_preview_2025_03_11"}, PATCH, {"type": "web_search"},
             {"type": "file_search", "vector_store_ids": []}, {"type": "web_search"}]
    functions, dropped = chat_tools(tools, refuse_hosted=False)
    assert [f["function"]["name"] for f in functions] == [
        "mcp__srv__spawn_agent", "mcp__srv__edit", "apply_patch"]
    assert dropped == ["web_search_preview_2025_03_11", "web_search", "file_search"]
    assert functions[2]["function"]["parameters"]["required"] == ["input"]
    assert functions[2]["function"]["description"].startswith("Edit files.")
    assert "start: /.+/" in functions[2]["function"]["description"]
    assert tool_names(tools) == {"mcp__srv__spawn_agent": Called("mcp__srv__", "spawn_agent",
                                                                 False),
                                 "mcp__srv__edit": Called("mcp__srv__", "_edit", True),
                                 "apply_patch": Called(None, "apply_patch", True)}


@pytest.mark.parametrize("tools", [
    [{"type": "code_interpreter", "container": {"type": "auto"}}],
    [SPAWN, {"type": "image_generation"}],
    [{"type": "namespace", "name": "a", "tools": [SPAWN]},
     {"type": "function", "name": "a__spawn_agent"}],  # the same name once flattened
    [{"type": "namespace", "name": "a"}],
])
def test_tools_refused(tools: list[Any]) -> None:
    with pytest.raises(Unsupported) as refused:
        chat_tools(tools, refuse_hosted=True)
    assert refused.value.param == "tools"


def test_every_tool_dropped_leaves_no_tool_choice() -> None:
    asked = {"model": "chat", "input": "hi", "tools": [{"type": "web_search"}],
             "tool_choice": "required"}
    translated = to_chat(asked)
    assert translated.body == chat(messages=[{"role": "user", "content": "hi"}])
    assert translated.dropped == ["web_search"]


def test_calls_sent_back_name_the_flat_tool() -> None:
    items = [{"type": "function_call", "call_id": "c1", "name": "spawn_agent",
              "namespace": "multi_agent_v1", "arguments": "{}"},
             {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch",
              "input": "*** Begin Patch"},
             {"type": "function_call_output", "call_id": "c1", "output": "ok"},
             {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"}]
    messages = to_chat({"model": "chat", "input": items}).body["messages"]
    assert messages == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "multi_agent_v1__spawn_agent", "arguments": "{}"}},
            {"id": "c2", "type": "function",
             "function": {"name": "apply_patch",
                          "arguments": '{"input":"*** Begin Patch"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        {"role": "tool", "tool_call_id": "c2", "content": "done"}]


NAMED = Echo("resp_1", "chat", 1700000000, called={
    "ns__f": Called("ns", "f", False), "patch": Called(None, "patch", True),
    "ns__p": Called("ns", "p", True)})


@st.composite
def named_completions(draw: st.DrawFn) -> dict[str, Any]:
    """Completions calling namespaced, custom and plain tools (a custom tool's input any
    text, or arguments of another shape)."""
    made = []
    for i in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(["ns__f", "patch", "ns__p", "plain"]))
        value = draw(st.one_of(st.builds(lambda t: {"input": t}, texts), arguments))
        made.append({"id": f"call_{i}", "type": "function",
                     "function": {"name": name, "arguments": orjson.dumps(value).decode()}})
    return {"choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": None,
                                     "tool_calls": made}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4}}


@settings(max_examples=100, deadline=None)
@given(named_completions(), st.lists(st.integers(0, 1000), max_size=6))
def test_calls_come_back_under_the_clients_names(completion: dict[str, Any],
                                                 cuts: list[int]) -> None:
    whole = to_response(completion, NAMED)
    Response.model_validate(whole)
    relay = ResponseStream(NAMED, Usage(), input_estimate=7)
    events = parse_stream(relay.feed(_chunks(completion, cuts)) + relay.flush())
    for event in events:
        EVENT.validate_python(event)
    assert accumulate(events) == whole
    for item, call in zip(whole["output"], completion["choices"][0]["message"]["tool_calls"],
                          strict=True):
        called = NAMED.called.get(call["function"]["name"])
        assert item.get("namespace") == (called.namespace if called else None)
        assert item["name"] == (called.name if called else "plain")
        sent = orjson.loads(call["function"]["arguments"])
        if called is not None and called.custom:
            assert item["type"] == "custom_tool_call"
            assert item["input"] == (sent["input"] if isinstance(sent, dict) and isinstance(
                sent.get("input"), str) else call["function"]["arguments"])
        else:
            assert item["type"] == "function_call"
            assert item["arguments"] == call["function"]["arguments"]
