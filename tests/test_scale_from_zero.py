"""Scale from zero (#34): a discovered group with no replica ready keeps its line. A
stream sent to it hears its place and an ETA of the warm-up; the group's wake hook is
called once; the engine the hook starts passes its health check and the line is served,
with no error. A group that stays cold answers 503 with Retry-After only after its
warm-up bound; the objective router counts a cold group's warm-up and sends the request
to a warm backend that is sooner."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from policies.config import SimulatedSpec
from router.upstream.simulated.app import RunningSim, start_simulator
from tests.support import (
    MESSAGES,
    RedisServer,
    StartGateway,
    assert_idle,
    closed_port,
    serve_app,
    sim_backend,
)

SPEC = SimulatedSpec(max_num_seqs=2, ttft_s=0.01, tokens_per_s=400, output_tokens=6)


class Hook:
    """The wake hook's receiver: each call recorded; with `starts`, the first one starts
    the engine at `port` (as an autoscaler would start a pod)."""

    def __init__(self, port: int, starts: bool) -> None:
        self.port, self.starts = port, starts
        self.calls: list[dict[str, Any]] = []
        self.sim: RunningSim | None = None
        self.called = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.calls.append(await request.json())
        if self.starts and self.sim is None:
            self.sim = await start_simulator(SPEC, "m", "127.0.0.1", self.port)
        self.called.set()
        return web.json_response({"ok": True})


@pytest.fixture(params=["local", "redis"])
def coordination(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The pools kept in this process, or shared through a private redis-server."""
    if request.param == "local":
        return {}
    server: RedisServer = request.getfixturevalue("redis_server")
    return {"coordination": {"mode": "redis", "url": server.url}}


@pytest.fixture
async def hooks() -> AsyncIterator[list[Hook]]:
    made: list[Hook] = []
    yield made
    for hook in made:
        if hook.sim is not None:
            await hook.sim.close()


async def cold_group(tmp_path: Path, hook: Hook, **discover: Any) -> dict[str, Any]:
    app = web.Application()
    app.router.add_post("/wake", hook.handle)
    _, url = await serve_app(app)
    urls = tmp_path / "replicas.txt"
    urls.write_text(f"http://127.0.0.1:{hook.port}/v1 engine-0\n")
    found = {"file": str(urls), "slots": 2, "refresh_s": 0.05, "check_s": 0.05,
             "warmup_s": 20, "wake_url": f"{url}/wake", **discover}
    return {"backends": {"big": {"model": "m", "discover": found, "queue_limit": 8,
                                 "scaling": {"floor": 0, "ceiling": 4}}},
            "routes": {"chat": {"primary": "big", "overflow": "reject"}},
            "fleet": {"refresh_s": 3600}}  # no look of its own: the wake's is seen


async def read_events(resp: aiohttp.ClientResponse) -> list[tuple[str, str]]:
    """(event, data) pairs of an SSE answer, to its end."""
    events, kind = [], "message"
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            events.append((kind, line[6:]))
            kind = "message"
    return events


async def test_a_request_to_an_empty_group_is_answered_once_a_replica_is_up(
        tmp_path: Path, start: StartGateway, http: aiohttp.ClientSession, hooks: list[Hook],
        coordination: dict[str, Any]) -> None:
    hook = Hook(closed_port(), starts=True)
    hooks.append(hook)
    gw = await start({**await cold_group(tmp_path, hook), **coordination})
    body = {"model": "chat", "messages": MESSAGES, "stream": True}
    async with http.post(f"{gw.url}/v1/chat/completions", json=body,
                         headers={"X-Slotgate-Queue-Events": "true"}) as resp:
        assert resp.status == 200
        events = await read_events(resp)
    statuses = [json.loads(data) for kind, data in events if kind == "queue_status"]
    assert statuses and statuses[0]["position"] == 1
    assert 15 <= statuses[0]["eta_s"] <= 21  # the warm-up left, then one replica's line
    chunks = [json.loads(d) for k, d in events if k == "message" and d != "[DONE]"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if c.get("choices"))
    assert len(text.split()) == 6 and events[-1] == ("message", "[DONE]")
    assert [c["backend"] for c in hook.calls] == ["big"]  # woken once
    assert hook.sim is not None and len(hook.sim.engine.records) == 1
    await assert_idle(gw)


async def test_a_group_that_stays_cold_answers_503_after_its_warmup_bound(
        tmp_path: Path, start: StartGateway, http: aiohttp.ClientSession,
        hooks: list[Hook], coordination: dict[str, Any]) -> None:
    hook = Hook(closed_port(), starts=False)
    hooks.append(hook)
    gw = await start({**await cold_group(tmp_path, hook, warmup_s=0.2, warmup_timeout_s=0.6),
                      **coordination})
    body = {"model": "chat", "messages": MESSAGES}

    async def ask() -> tuple[int, dict[str, str], Any]:
        async with http.post(f"{gw.url}/v1/chat/completions", json=body) as resp:
            return resp.status, dict(resp.headers), await resp.json()

    fleet = gw.gateway.fleet
    assert fleet is not None and fleet.readings["big"].desired == 0  # scaled to zero
    first, second = await asyncio.gather(ask(), ask())
    assert fleet.readings["big"].desired >= 1  # the wake: the gauge off 0 at once
    for status, headers, answer in (first, second):
        assert status == 503 and headers["x-slotgate-reject-reason"] == "warmup_timeout"
        assert int(headers["Retry-After"]) >= 1
        assert answer["error"]["code"] == "warmup_timeout"
    assert len(hook.calls) == 1  # one wake for the cold spell, whoever waited
    await assert_idle(gw)


async def test_the_objective_router_counts_a_cold_groups_warm_up(
        tmp_path: Path, start: StartGateway, http: aiohttp.ClientSession,
        hooks: list[Hook]) -> None:
    """A cold primary 20 s from a replica, a warm overflow of the same model: the request
    runs on the overflow, at once."""
    hook = Hook(closed_port(), starts=False)
    hooks.append(hook)
    raw = await cold_group(tmp_path, hook)
    raw["backends"]["warm"] = sim_backend("m", slots=2, queue_limit=4)
    raw["routes"]["chat"] = {"primary": "big", "fallbacks": ["warm"], "overflow": "reject",
                             "fallback": {"when": "objective"}}
    gw = await start(raw)
    body = {"model": "chat", "messages": MESSAGES}
    async with http.post(f"{gw.url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["x-slotgate-backend"] == "warm"
    await assert_idle(gw)
