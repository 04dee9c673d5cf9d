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
            return web.json_response(NATIVE)
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
