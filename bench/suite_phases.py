"""The suite's side-by-side phases: the scale of a run, the targets (direct, slotgate,
LiteLLM, nginx) and their placement on CPUs, and the rounds that interleave them (latency
at c=1, wrk at c=64, streams at c=16). The slotgate-alone phases are in suite_alone.py.
"""

from __future__ import annotations

import functools
import os
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from harness import free_port
from peer_configs import MOCK_MODEL, slotgate_yaml
from peer_tools import Tools
from peers import BENCH, Fleet, Server
from suite_load import LoadError, closed_loop_rps, latency_c1, run_wrk, streams, summarise

Result = dict[str, Any]
WORK = BENCH / ".work"
SERVER_CPU, LOAD_CPU = 0, 1
SLOTGATE_KEY = "sk-bench-slotgate-0123456789"
LITELLM_KEY = "sk-bench-litellm-0123456789"
SHORT_TOKENS = 16


@dataclass(frozen=True)
class Scale:
    rounds: int
    c1_requests: int  # per target and round (at most), after a warm-up
    c1_seconds: float  # and at most this long
    wrk_seconds: int
    stream_seconds: float  # streams start until this; the last ones finish
    queued: int  # queued streaming requests for the memory figure
    queue_seconds: float  # at most this long to queue them (as many as fit)
    handoff_direct: int
    handoff_gateway: int
    redis_rounds: int
    redis_seconds: int
    profile_seconds: int
    classifier_rounds: int
    tracing_rounds: int  # the tracing arms (off, ratio 1, ratio 0.1), rotating order
    tracing_seconds: int  # wrk per arm and round, after a 1 s warm-up
    concurrency: int = 64
    stream_clients: int = 16
    stream_chunks: int = 200
    handoff_clients: int = 20


FULL = Scale(rounds=4, c1_requests=1000, c1_seconds=2.5, wrk_seconds=5, stream_seconds=3.0,
             queued=10_000, queue_seconds=90.0, handoff_direct=2000, handoff_gateway=4000,
             redis_rounds=3, redis_seconds=4, profile_seconds=8, classifier_rounds=500,
             tracing_rounds=6, tracing_seconds=3)
QUICK = Scale(rounds=1, c1_requests=300, c1_seconds=1.0, wrk_seconds=2, stream_seconds=1.0,
              queued=2000, queue_seconds=30.0, handoff_direct=400, handoff_gateway=800,
              redis_rounds=1, redis_seconds=2, profile_seconds=3, classifier_rounds=100,
              tracing_rounds=3, tracing_seconds=1)


@dataclass
class Target:
    name: str
    server: Server  # whose CPU and memory are measured (the mock itself for direct)


class Suite:
    """What every phase shares: the fleet, the tools, the scale, the targets and the notes."""

    def __init__(self, fleet: Fleet, tools: Tools, scale: Scale, pinned: bool) -> None:
        self.fleet = fleet
        self.tools = tools
        self.scale = scale
        self.pinned = pinned
        self.notes: list[str] = []
        self.mock: Server | None = None
        self.targets: list[Target] = []

    # ------------------------------------------------------------ placement

    def place(self, under_test: Server | None) -> None:
        """The server under test on SERVER_CPU, everything else with the load on LOAD_CPU."""
        if not self.pinned:
            return
        os.sched_setaffinity(0, {LOAD_CPU})
        for server in self.fleet.servers:
            server.pin({LOAD_CPU})
        if under_test is not None:
            under_test.pin({SERVER_CPU})

    def unpin(self) -> None:
        every = set(range(os.cpu_count() or 1))
        os.sched_setaffinity(0, every)
        for server in self.fleet.servers:
            server.pin(every)

    # ------------------------------------------------------------ peers

    def start_peers(self) -> None:
        fleet = self.fleet
        self.mock = mock = fleet.mock()
        self.targets.append(Target("direct", mock))
        port = free_port()
        config = slotgate_yaml(port, {"primary": mock.url, "small": mock.url},
                               ledger=fleet.dir / "ledger.sqlite3", key=SLOTGATE_KEY)
        self.targets.append(Target("slotgate", fleet.slotgate("slotgate", config, port,
                                                              SLOTGATE_KEY)))
        self.targets.append(Target("aiohttp", fleet.passthrough(mock.url)))
        if self.tools.litellm:
            try:
                self.targets.append(Target("litellm", fleet.litellm(mock.url, LITELLM_KEY)))
            except RuntimeError as exc:
                self.notes.append(f"LiteLLM did not start, skipped: {str(exc)[-400:]}")
        if self.tools.nginx:
            try:
                self.targets.append(Target("nginx", fleet.nginx(self.tools.nginx, mock.url)))
            except RuntimeError as exc:
                self.notes.append(f"nginx did not start, skipped: {str(exc)[-400:]}")

    # ------------------------------------------------------------ the rounds

    async def latency(self, session: aiohttp.ClientSession, t: Target) -> Result:
        s = self.scale
        body = chat_body(SHORT_TOKENS, stream=False)
        samples = await latency_c1(session, t.server.chat_url, t.server.auth, body,
                                   s.c1_requests, s.c1_seconds)
        ms = summarise([x * 1000 for x in samples])
        return {"p50_ms": ms["p50"], "p99_ms": ms["p99"], "n": ms["n"]}

    async def throughput(self, session: aiohttp.ClientSession, t: Target, *,
                         warm: bool) -> Result:
        s, mock = self.scale, self.mock
        assert mock is not None
        body = chat_body(SHORT_TOKENS, stream=False)
        load = {LOAD_CPU} if self.pinned else None
        if warm and self.tools.wrk:  # opens the connections (and the gateway's upstream ones)
            run_wrk(self.tools.wrk, t.server.chat_url, body, t.server.auth, s.concurrency, 1,
                    load)
        cpu0, mock0, load0 = t.server.cpu_s(), mock.cpu_s(), _load_cpu_s()
        began = time.perf_counter()
        if self.tools.wrk:
            out = run_wrk(self.tools.wrk, t.server.chat_url, body, t.server.auth,
                          s.concurrency, s.wrk_seconds, load)
        else:
            out = await closed_loop_rps(session, t.server.chat_url, t.server.auth, body,
                                        s.concurrency, s.wrk_seconds)
        elapsed = time.perf_counter() - began
        cpu, mock_cpu = t.server.cpu_s() - cpu0, mock.cpu_s() - mock0
        load_cpu = _load_cpu_s() - load0 + (mock_cpu if t.server is not mock else 0.0)
        return {"rps": out["rps"], "p50_ms": out["p50_us"] / 1000, "p99_ms": out["p99_us"] / 1000,
                "errors": out["errors"], "requests": out["requests"],
                "cpu_us_per_request": cpu / out["requests"] * 1e6 if out["requests"] else None,
                "server_busy": cpu / elapsed, "mock_busy": mock_cpu / elapsed,
                "load_busy": load_cpu / elapsed}

    async def stream(self, session: aiohttp.ClientSession, t: Target) -> Result:
        s = self.scale
        mock = self.mock
        assert mock is not None
        body = chat_body(s.stream_chunks, stream=True)
        cpu0, mock0, load0 = t.server.cpu_s(), mock.cpu_s(), _load_cpu_s()
        run = await streams(session, t.server.chat_url, t.server.auth, body, s.stream_clients,
                            s.stream_seconds)
        cpu, mock_cpu = t.server.cpu_s() - cpu0, mock.cpu_s() - mock0
        load_cpu = _load_cpu_s() - load0 + (mock_cpu if t.server is not mock else 0.0)
        if not run.streams:
            raise LoadError(f"no stream completed: {run.first_error}")
        ttfc = summarise([x * 1000 for x in run.ttfc_s])
        return {"chunks_per_s": run.events_per_s, "ttfc_p50_ms": ttfc["p50"],
                "ttfc_p99_ms": ttfc["p99"], "streams": run.streams, "errors": run.errors,
                "chunks_per_stream": run.events / run.streams,
                "cpu_us_per_chunk": cpu / run.events * 1e6 if run.events else None,
                "server_busy": cpu / run.elapsed_s, "load_busy": load_cpu / run.elapsed_s}

    async def rounds(self, session: aiohttp.ClientSession) -> list[Result]:
        out: list[Result] = []
        n = len(self.targets)
        for r in range(self.scale.rounds):
            order = self.targets[r % n:] + self.targets[:r % n]
            row: Result = {"order": [t.name for t in order]}
            began = time.perf_counter()
            phases: list[tuple[str, Callable[[Target], Awaitable[Result]]]] = [
                ("latency_c1", lambda t: self.latency(session, t)),
                ("throughput_c64", functools.partial(self.throughput, session, warm=r == 0)),
                ("stream_c16", lambda t: self.stream(session, t)),
            ]
            for phase, measure in phases:
                row[phase] = {}
                for t in order:
                    self.place(t.server)
                    try:
                        row[phase][t.name] = await measure(t)
                    except (LoadError, aiohttp.ClientError, TimeoutError, OSError) as exc:
                        row[phase][t.name] = {"error": repr(exc)[:500]}
                        self.notes.append(f"round {r + 1} {phase} {t.name}: {exc!r:.300}")
            out.append(row)
            print(f"  round {r + 1}/{self.scale.rounds}: {time.perf_counter() - began:.0f} s "
                  f"({', '.join(row['order'])})", file=sys.stderr, flush=True)
        return out


def _load_cpu_s() -> float:
    """CPU seconds of the load side so far: this process and its finished children (wrk)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def chat_body(tokens: int, stream: bool) -> bytes:
    return orjson.dumps({"model": MOCK_MODEL, "max_tokens": tokens, "stream": stream,
                         "messages": [{"role": "user", "content": "Say something short."}]})

