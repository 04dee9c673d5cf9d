"""The engines of bench/replicas.py in a process of their own, and sglang-router in front of
them: every arm of that bench (a slotgate gateway per `pick:`, or SGLang's router) sends
its requests over HTTP to the same four simulated engines, started afresh (caches cold)
for each run.

Each engine is slotgate's simulated engine (`router.upstream.simulated`) with two
additions. It remembers which session and turn each request was (its first user message
and its number of user messages), so that every arm is counted the same way, on the
engine that served it, whatever the router in front forwards (sglang-router drops the
`user` field). And it answers GET /health with 200: sglang-router takes a worker only once
its /health answers (it then asks /server_info and /model_info, and their older names
/get_server_info and /get_model_info, and goes on when they answer 404: the workers'
model is "unknown" to it, and every request goes to the one group of four).

sglang-router is installed on demand into bench/.venv-sglang (gitignored), as the suite
installs LiteLLM (bench/peer_tools.py); when it cannot be installed its arm is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

import orjson
from aiohttp import web
from harness import HOST, REPO, free_port
from peer_tools import ensure_venv
from peers import Fleet, Server

from policies.config import SimulatedSpec
from router.upstream.simulated.app import create_sim_app
from router.upstream.simulated.engine import SimEngine, SimRecord
from router.upstream.simulated.reply import Plan

SGLANG_VENV = REPO / "bench" / ".venv-sglang"
SGLANG_REQUIREMENT = "sglang-router==0.3.2"
SGLANG_POLICY = "cache_aware"
_TURN = "bench_turn"  # the request's (session, turn), set by the middleware
_READY_TIMEOUT_S = 60.0

# What an engine reports per request it completed: the session (its first question) and
# turn, the prompt, its cached and the completion tokens, the seconds it ran on a sequence, its
# planned TTFT (TTFT plus the uncached prefill) and the seconds the request waited in the
# engine's own line for a sequence (to its first token, less the planned TTFT).
Served = tuple[str, int, int, int, int, float, float, float]


class CountingEngine(SimEngine):
    """A simulated engine that remembers which session and turn each request was."""

    def __init__(self, spec: SimulatedSpec, model: str) -> None:
        super().__init__(spec, model)
        self.turns: list[tuple[tuple[str, int], SimRecord]] = []

    def _begin(self, request: web.Request, plan: Plan) -> SimRecord:
        record = super()._begin(request, plan)
        self.turns.append((request.get(_TURN, ("", -1)), record))
        return record

    def served(self) -> list[Served]:
        out = []
        for (session, turn), r in self.turns:
            if not r.completed:
                continue
            planned = r.planned_ttft_s or 0.0
            queued = max(0.0, (r.first_token_at or r.started_at) - r.started_at - planned)
            out.append((session, turn, r.prompt_tokens, r.cached_tokens, r.completion_tokens,
                        (r.ended_at or r.started_at) - r.started_at - queued, planned,
                        queued))
        return out


@web.middleware
async def _tag(request: web.Request,
               handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
               ) -> web.StreamResponse:
    """A chat request's session (its first user message, which no two sessions share) and
    turn (its user messages less one); the handler reads the body again, from aiohttp's
    copy."""
    if request.method == "POST" and request.path == "/v1/chat/completions":
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            asked = [m.get("content") for m in orjson.loads(await request.read())["messages"]
                     if m.get("role") == "user"]
            request[_TURN] = (str(asked[0]), len(asked) - 1)
    return await handler(request)


async def _health(request: web.Request) -> web.Response:
    return web.Response()


async def _start(engine: CountingEngine) -> tuple[str, web.AppRunner]:
    app = create_sim_app(engine)
    app.middlewares.append(_tag)
    app.router.add_get("/health", _health)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, HOST, 0, backlog=1024).start()
    return f"http://{HOST}:{runner.addresses[0][1]}", runner


def serve_engines(spec: Mapping[str, Any], count: int, conn: Connection) -> None:
    """The engines' process: `count` engines of `spec` (seeds 0, 1, ...) until told to stop,
    then what each served, by name (group-0, group-1, ...: the gateway's names)."""
    asyncio.run(_serve_engines(spec, count, conn))


async def _serve_engines(spec: Mapping[str, Any], count: int, conn: Connection) -> None:
    # sglang-router probes a worker over gRPC too (HTTP/2 bytes): aiohttp would log each.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    engines = {f"group-{i}": CountingEngine(SimulatedSpec(**spec, seed=i), "m")
               for i in range(count)}
    runners = []
    try:
        urls = {}
        for name, engine in engines.items():
            urls[name], runner = await _start(engine)
            runners.append(runner)
        conn.send(urls)
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        conn.send({name: engine.served() for name, engine in engines.items()})
    finally:
        for engine in engines.values():
            engine.release()
        for runner in runners:
            await runner.cleanup()


# ---------------------------------------------------------------- sglang-router


def install_sglang(notes: list[str]) -> str | None:
    """The interpreter of bench/.venv-sglang with sglang-router in it, or None (and why in
    `notes`)."""
    if not ensure_venv(SGLANG_VENV, [SGLANG_REQUIREMENT], notes):
        return None
    return str(SGLANG_VENV / "bin" / "python")


def sglang_version(python: str) -> str:
    done = subprocess.run([python, "-c", "import importlib.metadata as m; "
                           "print(m.version('sglang-router'))"],
                          capture_output=True, text=True, timeout=60, check=False)
    return done.stdout.strip() or "?"


def start_sglang(fleet: Fleet, python: str, workers: Sequence[str]) -> Server:
    """sglang-router (`--policy cache_aware`, its other settings at their defaults) on a free
    loopback port in front of `workers`, once it holds all of them as healthy."""
    port = free_port()
    argv = [python, "-m", "sglang_router.launch_router", "--worker-urls", *workers,
            "--policy", SGLANG_POLICY, "--host", HOST, "--port", str(port),
            "--prometheus-host", HOST, "--prometheus-port", str(free_port()),
            "--log-level", "warn", "--shutdown-grace-period-secs", "1"]
    server = fleet.start("sglang-router", argv, f"http://{HOST}:{port}", "/health",
                         timeout_s=_READY_TIMEOUT_S)
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while _healthy_workers(server.url) < len(workers):
        if server.popen.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sglang-router did not take its {len(workers)} workers:\n"
                               f"{server.log_tail()}")
        time.sleep(0.1)
    return server


def _healthy_workers(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/workers", timeout=2.0) as resp:  # loopback only
            listing = json.loads(resp.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
        return 0
    return sum(bool(w.get("is_healthy")) for w in listing.get("workers", []))
