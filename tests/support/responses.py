"""For the Responses API's tests: an engine that serves /v1/responses itself (as vLLM
does), recording what it was sent, answering or streaming a fixed response, and holding
its answer on request (to see a client leave: its handler is cancelled)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from tests.support import serve_app

WEATHER: Any = {"type": "function", "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": {"type": "object", "required": ["city", "unit"],
                               "properties": {"city": {"type": "string"},
                                              "unit": {"enum": ["celsius", "fahrenheit"]}}}}
WEATHER_INPUT = {"city": "x", "unit": "celsius"}  # what the simulated engine calls it with
NATIVE_TEXT = "answered natively"
NATIVE: Any = {
    "id": "resp_native", "object": "response", "created_at": 1, "status": "completed",
    "error": None, "incomplete_details": None, "instructions": None, "model": "m",
    "output": [{"type": "message", "id": "msg_native", "status": "completed",
                "role": "assistant", "content": [{"type": "output_text", "text": NATIVE_TEXT,
                                                  "annotations": []}]}],
    "parallel_tool_calls": True, "temperature": None, "tool_choice": "auto", "tools": [],
    "top_p": None, "usage": {"input_tokens": 11, "output_tokens": 3, "total_tokens": 14}}


def sse(kind: str, data: dict[str, Any], seq: int) -> bytes:
    return (b"event: " + kind.encode() + b"\ndata: "
            + orjson.dumps({"type": kind, **data, "sequence_number": seq}) + b"\n\n")


class ResponsesEngine:
    """An engine serving POST /v1/responses: what it got in `bodies`; `hold()` keeps its
    answer (after a stream's first event) until `release()`; `aborted` is set when a
    client's leaving cancelled a held answer."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        self.aborted = asyncio.Event()
        self._gate = asyncio.Event()
        self._gate.set()
        self.with_usage = True  # False: its answers carry no usage
        self.runner: Any = None
        self.url = ""

    def hold(self) -> None:
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/responses", self._respond)
        self.runner, self.url = await serve_app(app)
        return self.url + "/v1"

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _wait(self) -> None:
        try:
            await self._gate.wait()
        except asyncio.CancelledError:
            self.aborted.set()
            raise

    async def _respond(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.arrived.set()
        if not body.get("stream"):
            await self._wait()
            return web.json_response(NATIVE if self.with_usage else {**NATIVE, "usage": None})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        started = {**NATIVE, "status": "in_progress", "output": [], "usage": None}
        await response.write(sse("response.created", {"response": started}, 0))
        await self._wait()
        item = {**NATIVE["output"][0], "status": "in_progress", "content": []}
        await response.write(sse("response.output_item.added",
                                 {"output_index": 0, "item": item}, 1))
        for seq, piece in enumerate(("answered ", "natively"), start=2):
            await response.write(sse("response.output_text.delta", {
                "item_id": "msg_native", "output_index": 0, "content_index": 0,
                "delta": piece, "logprobs": []}, seq))
        await response.write(sse("response.completed", {"response": NATIVE}, 4))
        await response.write_eof()
        return response


# -- the inverse translations -----------------------------------------------------------------

def responses_of(chat: dict[str, Any]) -> dict[str, Any]:
    """The Responses request a chat request (system, user, assistant, tool) stands for."""
    out: dict[str, Any] = {"model": chat["model"]}
    items: list[dict[str, Any]] = []
    for i, m in enumerate(chat["messages"]):
        if m["role"] == "system" and i == 0:
            out["instructions"] = m["content"]
        elif m["role"] == "assistant":
            if m.get("content") is not None:
                items.append({"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": m["content"], "annotations": []}]})
            items.extend({"type": "function_call", "call_id": call["id"],
                          "name": call["function"]["name"],
                          "arguments": call["function"]["arguments"]}
                         for call in m.get("tool_calls", ()))
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"],
                          "output": m["content"]})
        else:
            items.append({"role": m["role"], "content": m["content"]})
    out["input"] = items
    if "max_tokens" in chat:
        out["max_output_tokens"] = chat["max_tokens"]
    for name in ("temperature", "top_p", "stream", "user"):
        if name in chat:
            out[name] = chat[name]
    return out


def chat_of_response(response: dict[str, Any]) -> dict[str, Any]:
    """The chat completion a translated response came from (its text, calls, finish)."""
    texts = [part["text"] for item in response["output"] if item["type"] == "message"
             for part in item["content"]]
    calls = [{"id": item["call_id"], "type": "function",
              "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in response["output"] if item["type"] == "function_call"]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    finish = ("length" if response["status"] == "incomplete"
              else "tool_calls" if calls else "stop")
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": response["usage"]["input_tokens"],
                      "completion_tokens": response["usage"]["output_tokens"]}}


def parse_stream(raw: bytes) -> list[dict[str, Any]]:
    """The data of each event in a Responses stream's bytes (its name checked against its
    `type`)."""
    out = []
    for block in raw.split(b"\n\n"):
        lines = block.split(b"\n")
        if len(lines) == 2 and lines[0].startswith(b"event: "):
            data = orjson.loads(lines[1].removeprefix(b"data: "))
            assert data["type"] == lines[0][7:].decode()
            out.append(data)
        else:
            assert block == b"", f"not one named event: {block!r}"
    return out


def accumulate(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The response a Responses stream's events build (from the deltas, checking their
    order and numbering as it goes), and that it is the one its last event carries."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    output: list[dict[str, Any]] = []
    item: dict[str, Any] | None = None
    text = ""
    for e in events[2:-1]:
        kind = e["type"]
        if kind == "response.output_item.added":
            assert item is None and e["output_index"] == len(output)
            item, text = dict(e["item"]), ""
            continue
        assert item is not None and e.get("output_index") == len(output)
        if kind in ("response.output_text.delta", "response.function_call_arguments.delta",
                    "response.custom_tool_call_input.delta"):
            assert e["item_id"] == item["id"]
            text += e["delta"]
        elif kind == "response.output_text.done":
            assert e["text"] == text
        elif kind == "response.function_call_arguments.done":
            assert e["arguments"] == text
        elif kind == "response.custom_tool_call_input.done":
            assert e["input"] == text
        elif kind == "response.output_item.done":
            done = e["item"]
            if done["type"] == "message":
                assert done["content"][0]["text"] == text
            elif done["type"] == "custom_tool_call":
                assert done["input"] == text
            else:
                assert done["arguments"] == text
            output.append(done)
            item = None
        else:
            assert kind in ("response.content_part.added", "response.content_part.done")
    assert item is None
    final: dict[str, Any] = events[-1]["response"]
    assert final["output"] == output
    return final
