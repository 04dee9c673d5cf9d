"""What several hostile-client tests share: an engine that records what reaches it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict

from tests.support import MESSAGES, serve_app

ANSWER: dict[str, Any] = {
    "id": "c1", "object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class Recorder:
    """An engine that records the headers and body of every chat request it gets, and
    answers its health check (`GET /v1/models`)."""

    def __init__(self) -> None:
        self.seen: list[tuple[CIMultiDict[str], bytes]] = []
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self.handle)
        self.app.router.add_get("/v1/models", self.models)

    @property
    def last_headers(self) -> CIMultiDict[str]:
        return self.seen[-1][0]

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((CIMultiDict(request.headers), await request.read()))
        return web.json_response(ANSWER, dumps=lambda o: orjson.dumps(o).decode())

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, str]]:
    rec = Recorder()
    runner, url = await serve_app(rec.app)
    yield rec, url
    await runner.cleanup()


async def answered(reader: asyncio.StreamReader, within_s: float = 30.0) -> bytes:
    """Everything the gateway sends until it closes the connection."""
    async with asyncio.timeout(within_s):
        try:
            return await reader.read()
        except ConnectionError:  # a reset, or our own write that met one
            return b"<reset>"


def chat(**extra: Any) -> bytes:
    return orjson.dumps({"model": "chat", "messages": MESSAGES, **extra})


def nested(depth: int) -> bytes:
    """A chat request whose body nests `depth` levels (the top object is level 1)."""
    inner = b"[" * (depth - 1) + b"]" * (depth - 1)
    return chat()[:-1] + b',"deep":' + inner + b"}"
