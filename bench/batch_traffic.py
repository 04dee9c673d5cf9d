"""Interactive traffic of the batch bench: streamed chat requests read as a client reads
them (time to first token, where they ran, the gateway's queue wait and the wait it
forecast first, a refusal), and a Poisson schedule of them that two gateways can be given
alike.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from router.tools.demo import HARD
from router.tools.workload import arrival_times

REFUSED = (429, 503)


@dataclass
class Stream:
    """One streamed request as its client saw it (times from time.monotonic)."""

    request_id: str
    sent_at: float
    status: int = 0
    error: str | None = None  # a refusal's code: an HTTP error, or an error event
    ttft_s: float | None = None  # to the first chunk of the answer
    backend: str | None = None
    queue_wait_ms: float | None = None  # the gateway's, from its `start` event
    eta_s: float | None = None  # the wait the gateway forecast in its first queue_status

    @property
    def refused(self) -> bool:
        return self.status in REFUSED or self.error is not None


@dataclass(frozen=True)
class Arrival:
    at_s: float  # after the schedule's start
    request_id: str
    body: dict[str, Any]


def chat(prompt: str, max_tokens: int, model: str) -> dict[str, Any]:
    return {"model": model, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt}]}


def poisson(rate: float, duration_s: float, seed: int, model: str,
            length: Callable[[random.Random], int], prompts: Sequence[str] = HARD
            ) -> list[Arrival]:
    """Arrivals at `rate` per second for `duration_s`: the same list for the same seed.
    `length(rng)` draws each request's max_tokens."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    for n, at in enumerate(arrival_times(rate, rng)):
        if at >= duration_s:
            return out
        body = chat(rng.choice(prompts), length(rng), model)
        out.append(Arrival(at, f"ia-{n}", body))
    raise AssertionError("arrival_times never ends")


async def stream_chat(session: aiohttp.ClientSession, url: str, body: Mapping[str, Any],
                      request_id: str, headers: Mapping[str, str]) -> Stream:
    """POST a streamed chat request and read it to its end."""
    out = Stream(request_id, time.monotonic())
    sent = {**headers, "x-request-id": request_id, "X-Slotgate-Queue-Events": "true"}
    async with session.post(url + "/v1/chat/completions", data=orjson.dumps(body),
                            headers={**sent, "Content-Type": "application/json"}) as resp:
        out.status = resp.status
        out.backend = resp.headers.get("x-slotgate-backend")
        if resp.status != 200:
            out.error = _code(await resp.read()) or str(resp.status)
            return out
        await _read(resp.content, out)
    return out


async def _read(content: aiohttp.StreamReader, out: Stream) -> None:
    event = b""
    async for raw in content:
        line = raw.strip()
        if line.startswith(b"event:"):
            event = line[6:].strip()
            continue
        if not line.startswith(b"data:"):
            continue  # blank lines and comments
        data = line[5:].strip()
        if event == b"start":
            started = orjson.loads(data)
            out.backend, out.queue_wait_ms = started["backend"], started["queue_wait_ms"]
        elif event == b"queue_status" and out.eta_s is None:
            out.eta_s = orjson.loads(data).get("eta_s")
        elif data.startswith(b'{"error"'):
            out.error = _code(data) or "error"
        elif event == b"" and data != b"[DONE]" and out.ttft_s is None:
            out.ttft_s = time.monotonic() - out.sent_at
        event = b""


def _code(data: bytes) -> str | None:
    try:
        found = orjson.loads(data)["error"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return str(found.get("code") or found.get("type") or "error")


async def run_schedule(session: aiohttp.ClientSession, url: str, arrivals: Sequence[Arrival],
                       start: float, headers: Mapping[str, str]) -> list[Stream]:
    """Send each arrival at `start` (time.monotonic) + its offset; every stream, read."""
    async def one(arrival: Arrival) -> Stream:
        await asyncio.sleep(max(0.0, start + arrival.at_s - time.monotonic()))
        return await stream_chat(session, url, arrival.body, arrival.request_id, headers)

    return list(await asyncio.gather(*(one(a) for a in arrivals)))


def new_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 timeout=aiohttp.ClientTimeout(total=180))
