"""The Messages API's translations, without sockets: tables of request cases, and
properties: chat -> messages -> chat round trips keep text, tool calls and stop reasons,
and a streamed answer builds the same message as the whole one."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.scheduler.capabilities import Capability, needs_of
from router.apis.anthropic_answer import to_message
from router.apis.anthropic_request import Unsupported, to_chat
from router.apis.anthropic_stream import MessageStream
from router.common.usage import Usage
from tests.support.anthropic import accumulate, chat_of, messages_of, parse_stream

BASE: dict[str, Any] = {"model": "chat", "max_tokens": 10}
USER: Any = [{"role": "user", "content": "hi"}]
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBOR"}}
CALL = {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"a": 1}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}


def chat(**fields: Any) -> dict[str, Any]:
    return to_chat({**BASE, "messages": USER, **fields})


@pytest.mark.parametrize(("fields", "expected"), [
    ({"system": "be brief"}, {"messages": [{"role": "system", "content": "be brief"}, *USER]}),
    ({"system": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                 {"type": "text", "text": "b"}]},
     {"messages": [{"role": "system", "content": "a\nb"}, *USER]}),
    ({"stop_sequences": ["\n\n"], "temperature": 0.5, "top_p": 0.9, "top_k": 5},
     {"stop": ["\n\n"], "temperature": 0.5, "top_p": 0.9, "top_k": 5}),
    ({"metadata": {"user_id": "u-1"}, "stream": True}, {"user": "u-1", "stream": True}),
    ({"tools": [{"name": "get", "description": "d", "input_schema": {"type": "object"}}]},
     {"tools": [{"type": "function", "function": {"name": "get", "description": "d",
                                                  "parameters": {"type": "object"}}}]}),
    ({"tool_choice": {"type": "auto"}}, {"tool_choice": "auto"}),
    ({"tool_choice": {"type": "any", "disable_parallel_tool_use": True}},
     {"tool_choice": "required", "parallel_tool_calls": False}),
    ({"tool_choice": {"type": "tool", "name": "get"}},
     {"tool_choice": {"type": "function", "function": {"name": "get"}}}),
    ({"tool_choice": {"type": "none"}}, {"tool_choice": "none"}),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}, "service_tier": "auto"}, {}),
])
def test_request_fields(fields: dict[str, Any], expected: dict[str, Any]) -> None:
    assert chat(**fields) == {"model": "chat", "max_tokens": 10, "messages": USER, **expected}


@pytest.mark.parametrize(("messages", "expected"), [
    ([{"role": "user", "content": [{"type": "text", "text": "look"}, IMAGE]}],
     [{"role": "user", "content": [
         {"type": "text", "text": "look"},
         {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}}]}]),
    ([{"role": "user", "content": [{"type": "image", "source": {
        "type": "url", "url": "https://x/y.png"}}]}],
     [{"role": "user", "content": [{"type": "image_url",
                                    "image_url": {"url": "https://x/y.png"}}]}]),
    ([*USER, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hm", "signature": "s"},
        {"type": "text", "text": "let me see"}, CALL]},
      {"role": "user", "content": [RESULT, {"type": "text", "text": "and?"}]}],
     [*USER, {"role": "assistant", "content": "let me see", "tool_calls": [
         {"id": "toolu_1", "type": "function",
          "function": {"name": "get", "arguments": '{"a":1}'}}]},
      {"role": "tool", "tool_call_id": "toolu_1", "content": "done"},
      {"role": "user", "content": "and?"}]),
    ([*USER, {"role": "assistant", "content": [CALL]},
      {"role": "user", "content": [{**RESULT, "is_error": True, "content": [
          {"type": "text", "text": "no"}, IMAGE]}]}],
     [*USER, {"role": "assistant", "content": None, "tool_calls": [
         {"id": "toolu_1", "type": "function",
          "function": {"name": "get", "arguments": '{"a":1}'}}]},
      {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: no"},
      {"role": "user", "content": [{"type": "image_url", "image_url": {
          "url": "data:image/png;base64,iVBOR"}}]}]),
])
def test_content_blocks(messages: Any, expected: Any) -> None:
    assert chat(messages=messages)["messages"] == expected


def test_a_system_turn_in_messages_stays_at_its_place() -> None:
    """Claude Code's shape (the mid-conversation-system beta): a system turn after the
    prompt, then the tool round trip."""
    messages = [*USER, {"role": "system", "content": "Available agent types: ..."},
                {"role": "assistant", "content": [CALL]},
                {"role": "user", "content": [RESULT]},
                {"role": "system", "content": [{"type": "text", "text": "a"},
                                               {"type": "text", "text": "b"}]}]
    expected = [*USER, {"role": "system", "content": "Available agent types: ..."},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "toolu_1", "type": "function",
                     "function": {"name": "get", "arguments": '{"a":1}'}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "done"},
                {"role": "system", "content": "a\nb"}]
    assert chat(messages=messages)["messages"] == expected


@pytest.mark.parametrize(("fields", "param"), [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
    ({"messages": [*USER, {"role": "system", "content": [{"type": "image"}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "messages"),
    ({"messages": [{"role": "assistant", "content": [IMAGE]}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools"),
    ({"tools": [{"name": "get"}]}, "tools"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"mcp_servers": [{"url": "x"}]}, "mcp_servers"),
    ({"system": [{"type": "image"}]}, "system"),
    ({"stop_sequences": "x"}, "stop_sequences"),
])
def test_what_is_refused(fields: dict[str, Any], param: str) -> None:
    body = {**BASE, "messages": USER, **fields}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(Unsupported) as refused:
        to_chat(body)
    assert refused.value.param == param


def test_count_tokens_needs_no_max_tokens() -> None:
    assert "max_tokens" not in to_chat({"model": "chat", "messages": USER}, count_only=True)


def test_capabilities_read_the_translated_conversation() -> None:
    with_tools = chat(messages=[*USER, {"role": "assistant", "content": [CALL]},
                                {"role": "user", "content": [RESULT]}])
    assert needs_of(with_tools, 10, 10).capabilities == {Capability.TOOLS}
    offered = chat(tools=[{"name": "get", "input_schema": {"type": "object"}}])
    assert needs_of(offered, 10, 10).capabilities == {Capability.TOOLS}
    seeing = chat(messages=[{"role": "user", "content": [IMAGE]}])
    assert needs_of(seeing, 10, 10).capabilities == {Capability.VISION}


# -- properties --------------------------------------------------------------------------------

texts = st.text(st.characters(codec="utf-8"), min_size=1,
                max_size=40)
names = st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True)
ids = st.from_regex(r"call_[a-z0-9]{1,8}", fullmatch=True)
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
    """A chat request of the shapes the Messages API can say: a system prompt, user turns,
    assistant turns with text and tool calls, each call answered by a tool message."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(texts)})
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
        out["stop"] = draw(st.lists(texts, min_size=1, max_size=2))
    if draw(st.booleans()):
        out["user"] = draw(names)
    return out


@settings(max_examples=200, deadline=None)
@given(conversations())
def test_a_conversation_round_trips(conversation: dict[str, Any]) -> None:
    assert to_chat(messages_of(conversation)) == conversation


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
    """What the round trip keeps: text, tool calls (arguments as values), finish, usage."""
    choice = completion["choices"][0]
    message = choice["message"]
    return {"text": message["content"] or "", "finish": choice["finish_reason"],
            "calls": [(c["id"], c["function"]["name"], orjson.loads(c["function"]["arguments"]))
                      for c in message.get("tool_calls", ())],
            "usage": (completion["usage"]["prompt_tokens"],
                      completion["usage"]["completion_tokens"])}


@settings(max_examples=200, deadline=None)
@given(completions())
def test_an_answer_round_trips(completion: dict[str, Any]) -> None:
    message = to_message(completion, "msg_1", "chat")
    assert message["type"] == "message" and message["model"] == "chat"
    assert _normal(chat_of(message)) == _normal(completion)


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
    text = message["content"] or ""
    for piece in _split(text, cuts):
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
def test_a_stream_builds_the_same_message(completion: dict[str, Any], cuts: list[int],
                                          sizes: list[int]) -> None:
    """Whatever the engine's chunking and the network's byte boundaries."""
    raw = _chunks(completion, cuts)
    usage = Usage()
    relay = MessageStream("msg_1", "chat", usage, input_estimate=7)
    out, at, i = [], 0, 0
    while at < len(raw):
        size = sizes[i % len(sizes)]
        out.append(relay.feed(raw[at:at + size]))
        at, i = at + size, i + 1
    out.append(relay.flush())
    streamed = accumulate(parse_stream(b"".join(out)))
    whole = to_message(completion, "msg_1", "chat")
    assert streamed == whole
    assert usage.known and usage.completion_tokens == completion["usage"]["completion_tokens"]


def test_a_stream_that_ends_without_done_still_ends() -> None:
    relay = MessageStream("msg_1", "chat", Usage())
    raw = (b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}'
           b"\n\n")
    events = parse_stream(relay.feed(raw) + relay.flush())
    assert [n for n, _ in events] == ["message_start", "content_block_start",
                                      "content_block_delta", "content_block_stop",
                                      "message_delta", "message_stop"]
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    assert events[-2][1]["usage"] == {"output_tokens": 1}  # counted: the engine said nothing


def test_a_matched_stop_sequence_is_named() -> None:
    completion = {"choices": [{"message": {"content": "a"}, "finish_reason": "stop",
                               "stop_reason": "\n\n"}]}
    message = to_message(completion, "msg_1", "chat")
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "\n\n")
