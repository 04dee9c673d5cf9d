"""For the Messages API's tests: the official `anthropic` SDK pointed at a gateway, an SSE
reader for raw streams, and the inverse translations (an Anthropic request from a chat
request, a chat completion from a message) the round-trip properties check against."""

from __future__ import annotations

from typing import Any

import aiohttp
import anthropic
import orjson

from router.app import RunningGateway

ASK: Any = [{"role": "user", "content": "tell me something"}]
WEATHER: Any = {"name": "get_weather", "description": "The weather in a city.",
                "input_schema": {"type": "object", "required": ["city", "unit"],
                                 "properties": {"city": {"type": "string"},
                                                "unit": {"enum": ["celsius", "fahrenheit"]}}}}
WEATHER_INPUT = {"city": "x", "unit": "celsius"}  # what the simulated engine calls it with


class AnthropicClients:
    """The official Anthropic SDK pointed at a gateway, one client per call, no retries
    (every status is seen); the fixture closes every client it built."""

    def __init__(self) -> None:
        self._made: list[anthropic.AsyncAnthropic] = []

    def __call__(self, gw: RunningGateway, **kwargs: Any) -> anthropic.AsyncAnthropic:
        kwargs.setdefault("api_key", "sk-ant-client")
        kwargs.setdefault("max_retries", 0)
        client = anthropic.AsyncAnthropic(base_url=gw.url, **kwargs)
        self._made.append(client)
        return client

    async def aclose(self) -> None:
        while self._made:
            await self._made.pop().close()


async def read_events(resp: aiohttp.ClientResponse) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) of every event, and (":", text) of every comment."""
    out: list[tuple[str | None, Any]] = []
    name: str | None = None
    async for raw in resp.content:
        line = raw.rstrip(b"\r\n")
        if line.startswith(b":"):
            out.append((":", line[1:].strip().decode()))
        elif line.startswith(b"event:"):
            name = line[6:].strip().decode()
        elif line.startswith(b"data:"):
            out.append((name, orjson.loads(line[5:].strip())))
            name = None
    return out


# -- the inverse translations -----------------------------------------------------------------

_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
           "tool_use": "tool_calls"}


def chat_of(message: dict[str, Any]) -> dict[str, Any]:
    """The chat completion a translated message came from (its text, calls and finish)."""
    texts = [b["text"] for b in message["content"] if b["type"] == "text"]
    calls = [{"id": b["id"], "type": "function",
              "function": {"name": b["name"], "arguments": orjson.dumps(b["input"]).decode()}}
             for b in message["content"] if b["type"] == "tool_use"]
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        out["tool_calls"] = calls
    return {"choices": [{"index": 0, "message": out,
                         "finish_reason": _FINISH[message["stop_reason"]]}],
            "usage": {"prompt_tokens": message["usage"]["input_tokens"],
                      "completion_tokens": message["usage"]["output_tokens"]}}


def messages_of(chat: dict[str, Any]) -> dict[str, Any]:
    """The Anthropic request a chat request (system, user, assistant, tool) stands for."""
    out: dict[str, Any] = {"model": chat["model"], "max_tokens": chat["max_tokens"]}
    turns: list[dict[str, Any]] = []
    for m in chat["messages"]:
        if m["role"] == "system":
            out["system"] = m["content"]
        elif m["role"] == "assistant":
            blocks: list[dict[str, Any]] = []
            if m.get("content"):
                blocks.append({"type": "text", "text": m["content"]})
            for call in m.get("tool_calls", ()):
                blocks.append({"type": "tool_use", "id": call["id"],
                               "name": call["function"]["name"],
                               "input": orjson.loads(call["function"]["arguments"])})
            turns.append({"role": "assistant", "content": blocks})
        elif m["role"] == "tool":
            result = {"type": "tool_result", "tool_use_id": m["tool_call_id"],
                      "content": m["content"]}
            if turns and turns[-1]["role"] == "user" and isinstance(turns[-1]["content"], list):
                turns[-1]["content"].append(result)
            else:
                turns.append({"role": "user", "content": [result]})
        elif turns and turns[-1]["role"] == "user" and isinstance(turns[-1]["content"], list):
            turns[-1]["content"].append({"type": "text", "text": m["content"]})
        else:
            turns.append({"role": "user", "content": m["content"]})
    out["messages"] = turns
    for name in ("temperature", "top_p", "stream"):
        if name in chat:
            out[name] = chat[name]
    if "stop" in chat:
        out["stop_sequences"] = chat["stop"]
    if "user" in chat:
        out["metadata"] = {"user_id": chat["user"]}
    return out


def parse_stream(raw: bytes) -> list[tuple[str, Any]]:
    """(name, data) of each event in an Anthropic stream's bytes."""
    out = []
    for block in raw.split(b"\n\n"):
        lines = block.split(b"\n")
        if len(lines) == 2 and lines[0].startswith(b"event: "):
            out.append((lines[0][7:].decode(), orjson.loads(lines[1].removeprefix(b"data: "))))
        else:
            assert block == b"", f"not one named event: {block!r}"
    return out


def accumulate(events: list[tuple[str, Any]]) -> dict[str, Any]:
    """The message an Anthropic stream's events build, checking their order as it goes."""
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    message = events[0][1]["message"]
    open_index: int | None = None
    partial = ""
    for name, data in events[1:-2]:
        if name == "content_block_start":
            assert open_index is None and data["index"] == len(message["content"])
            open_index, partial = data["index"], ""
            message["content"].append(dict(data["content_block"]))
        elif name == "content_block_delta":
            assert data["index"] == open_index
            block, delta = message["content"][-1], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            else:
                assert delta["type"] == "input_json_delta"
                partial += delta["partial_json"]
        else:
            assert name == "content_block_stop" and data["index"] == open_index
            if message["content"][-1]["type"] == "tool_use":
                message["content"][-1]["input"] = orjson.loads(partial) if partial else {}
            open_index = None
    assert open_index is None
    delta = events[-2][1]
    message.update(delta["delta"])
    message["usage"] = {**message["usage"], **delta["usage"]}
    return dict(message)
