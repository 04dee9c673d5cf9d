"""The side-by-side benchmark suite (`make bench`): slotgate against its peers, same run.

    .venv/bin/python bench/suite.py [--quick] [--rounds N] [--apt] [--no-litellm]
                                    [--no-nginx] [--no-doc] [--json FILE]

Targets, all in front of one fast mock engine (bench/mock_backend.py, zero think time):
direct (no proxy), slotgate (`slotgate serve`, production-like config: auth, access log,
metrics, SQLite ledger, intent fallback on saturation; 1,024 slots), LiteLLM's proxy (one
worker, no database, telemetry off) and nginx (keep-alive upstream, proxy_buffering off).
Rounds interleave the targets (the order rotates every round) phase by phase: latency at
concurrency 1, wrk at 64, streams at 16. Then, for slotgate alone: a py-spy profile under
the c=64 load, slot hand-off under saturation, memory per queued streaming request (10,000
queued), classifier latency, and requests/s with Redis coordination for 1 and 2 processes.

Pinning (2+ CPUs): the server under test on CPU 0; the load generator (wrk or this
process) and the mock on CPU 1; for `direct` the mock is the server under test, on CPU 0.
The Redis phase runs unpinned (two gateway processes need both cores).

The results go to the terminal, to bench/.work/suite-*.json, and (unless --no-doc) to the
top section of docs/BENCHMARKS.md and docs/bench-peers.png. Loopback only; every loop is
bounded in count and time; every process is stopped on every exit path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

# Run as a script, so this directory is on sys.path and the siblings import by name.
from harness import HOST, free_port
from load import Target as TaggedTarget
from load import handoff_gaps, tagged_requests
from peers import BENCH, MOCK_MODEL, TOOLS_VENV, Fleet, Server, Tools, prepare, slotgate_yaml
from suite_load import (
    LoadError,
    closed_loop_rps,
    latency_c1,
    park_streams,
    run_wrk,
    streams,
    summarise,
)
from suite_profile import parse as parse_profile
from suite_profile import summary as profile_summary
from suite_report import describe_machine, finish

Result = dict[str, Any]
WORK = BENCH / ".work"
SERVER_CPU, LOAD_CPU = 0, 1
SLOTGATE_KEY = "sk-bench-slotgate-0123456789"
LITELLM_KEY = "sk-bench-litellm-0123456789"
SHORT_TOKENS = 16
HELD_PROMPT = "Prove that there are infinitely many primes, with every step justified."


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
    concurrency: int = 64
    stream_clients: int = 16
    stream_chunks: int = 200
    handoff_clients: int = 20


FULL = Scale(rounds=4, c1_requests=1000, c1_seconds=2.5, wrk_seconds=5, stream_seconds=3.0,
             queued=10_000, queue_seconds=90.0, handoff_direct=2000, handoff_gateway=4000,
             redis_rounds=3, redis_seconds=4, profile_seconds=8, classifier_rounds=500)
QUICK = Scale(rounds=1, c1_requests=300, c1_seconds=1.0, wrk_seconds=2, stream_seconds=1.0,
              queued=2000, queue_seconds=30.0, handoff_direct=400, handoff_gateway=800,
              redis_rounds=1, redis_seconds=2, profile_seconds=3, classifier_rounds=100)


@dataclass
class Target:
    name: str
    server: Server  # whose CPU and memory are measured (the mock itself for direct)


class Suite:
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
        body = _body(SHORT_TOKENS, stream=False)
        samples = await latency_c1(session, t.server.chat_url, t.server.auth, body,
                                   s.c1_requests, s.c1_seconds)
        ms = summarise([x * 1000 for x in samples])
        return {"p50_ms": ms["p50"], "p99_ms": ms["p99"], "n": ms["n"]}

    async def throughput(self, session: aiohttp.ClientSession, t: Target, *,
                         warm: bool) -> Result:
        s, mock = self.scale, self.mock
        assert mock is not None
        body = _body(SHORT_TOKENS, stream=False)
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
        body = _body(s.stream_chunks, stream=True)
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

    # ------------------------------------------------------------ profile

    def profile(self) -> Result | None:
        """py-spy on slotgate while wrk holds it at c=64 (not during the measured rounds)."""
        if not (self.tools.py_spy and self.tools.wrk):
            self.notes.append("profile skipped: needs py-spy and wrk")
            return None
        gw = next(t.server for t in self.targets if t.name == "slotgate")
        self.place(gw)
        WORK.mkdir(exist_ok=True)
        raw = WORK / "profile-c64.txt"
        s = self.scale
        load = {LOAD_CPU} if self.pinned else None
        wrk = subprocess.Popen(
            [*(["taskset", "-c", str(LOAD_CPU)] if load else []), self.tools.wrk, "-t1",
             f"-c{s.concurrency}", f"-d{s.profile_seconds + 3}s", "-s",
             str(BENCH / "wrk_post.lua"), gw.chat_url],
            env={**os.environ, "BENCH_BODY": _body(SHORT_TOKENS, False).decode(),
                 "BENCH_AUTH": gw.auth},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            spy = subprocess.run(
                [*(["taskset", "-c", str(LOAD_CPU)] if load else []), self.tools.py_spy,
                 "record", "--pid", str(gw.pid), "--rate", "250", "--duration",
                 str(s.profile_seconds), "--threads", "--nolineno", "--format", "raw",
                 "--output", str(raw)],
                capture_output=True, timeout=s.profile_seconds + 60, check=False)
        finally:
            wrk.wait(timeout=s.profile_seconds + 60)
        if spy.returncode != 0 or not raw.exists():
            self.notes.append(f"py-spy failed: {spy.stderr.decode(errors='replace')[-300:]}")
            return None
        summary = profile_summary(parse_profile(raw.read_text()), top=15)
        summary["raw_file"] = str(raw.relative_to(BENCH.parent))
        summary["seconds"] = s.profile_seconds
        summary["rate_hz"] = 250
        return summary

    # ------------------------------------------------------------ saturation

    async def saturation(self, session: aiohttp.ClientSession) -> Result:
        """Slot hand-off and memory per queued request, on a gateway of their own over
        slotgate's simulator (records of every request; can hold every generation)."""
        s, fleet = self.scale, self.fleet
        sim = fleet.simulator()
        port = free_port()
        extra_backends = (
            f"  handoff: {{url: \"{sim.url}/v1\", model: {MOCK_MODEL}, slots: 1, "
            f"queue_limit: 10000, queue_timeout_s: 300}}\n"
            f"  held: {{url: \"{sim.url}/v1\", model: {MOCK_MODEL}, slots: 1, "
            f"queue_limit: {s.queued + 100}, queue_timeout_s: 600}}\n")
        extra_routes = ("  handoff: {primary: handoff, overflow: reject}\n"
                        "  held: {primary: held, overflow: reject}\n")
        config = slotgate_yaml(port, {"primary": sim.url, "small": sim.url},
                               ledger=fleet.dir / "ledger-saturation.sqlite3",
                               key=SLOTGATE_KEY, extra_backends=extra_backends,
                               extra_routes=extra_routes)
        gw = fleet.slotgate("slotgate-saturation", config, port, SLOTGATE_KEY)
        self.place(gw)
        out: Result = {"handoff": await self._handoff(session, sim, gw)}
        out["queue_memory"] = await self._queue_memory(session, sim, gw, port)
        fleet.retire(sim)
        return out

    async def _handoff(self, session: aiohttp.ClientSession, sim: Server, gw: Server) -> Result:
        s = self.scale
        async with session.post(sim.url + "/sim/reset") as resp:
            resp.raise_for_status()
        await tagged_requests(session, TaggedTarget("direct", sim.chat_url, MOCK_MODEL), 1,
                              s.handoff_direct, 60.0, "ho-direct")
        done = await tagged_requests(session, TaggedTarget("gateway", gw.chat_url, "handoff"),
                                     s.handoff_clients, s.handoff_gateway, 90.0, "ho-gateway",
                                     {"Authorization": gw.auth})
        async with session.get(sim.url + "/sim/requests") as resp:
            records = orjson.loads(await resp.read())
        skip = s.handoff_clients  # the queue still filling
        direct = handoff_gaps(records, "ho-direct-", skip)
        gateway = handoff_gaps(records, "ho-gateway-", skip)[: -s.handoff_clients]  # draining
        d, g = summarise([x * 1000 for x in direct]), summarise([x * 1000 for x in gateway])
        return {"direct_ms": d, "gateway_ms": g, "requests": done,
                "added_p50_ms": g["p50"] - d["p50"], "added_p99_ms": g["p99"] - d["p99"],
                "engine_overlaps": sum(gap < 0 for gap in gateway)}

    async def _queue_memory(self, session: aiohttp.ClientSession, sim: Server, gw: Server,
                            port: int) -> Result:
        s = self.scale
        body = orjson.dumps({"model": "held", "stream": True, "max_tokens": SHORT_TOKENS,
                             "messages": [{"role": "user", "content": HELD_PROMPT}]})
        async with session.post(sim.url + "/sim/hold", json={"after_tokens": 0}) as resp:
            resp.raise_for_status()
        # the engine sends no token, so the gateway has nothing to relay yet: wait for the
        # engine to hold the request, not for the holder's response headers
        holder = await park_streams(HOST, port, "/v1/chat/completions", gw.auth, body, 1, 1, 30,
                                    headers=False)
        parked = None
        try:
            if not holder.writers or not await _wait_held(session, sim, 1, 30.0):
                raise LoadError(f"the slot holder did not start: {holder.first_error}")
            await asyncio.sleep(1.0)
            rss0, hwm0 = gw.rss_mib(), gw.hwm_mib()
            began = time.perf_counter()
            # as many as the gateway takes in the time allowed: those not connected by then
            # give up (counted as not queued)
            parked = await park_streams(HOST, port, "/v1/chat/completions", gw.auth, body,
                                        s.queued, 256, s.queue_seconds)
            queued_in_s = time.perf_counter() - began
            depth = await _wait_queue(session, gw, "held", len(parked.writers), 30.0)
            await asyncio.sleep(1.0)
            rss1, hwm1 = gw.rss_mib(), gw.hwm_mib()
        finally:
            # stopped before the clients leave: every departure would be a queue change
            # reported to every waiter behind it
            self.fleet.retire(gw)
            holder.close()
            if parked is not None:
                parked.close()
            async with session.post(sim.url + "/sim/release") as resp:
                resp.raise_for_status()
        return {"queued": depth, "wanted": s.queued, "not_queued": parked.failed,
                "first_error": parked.first_error, "rss_before_mib": rss0,
                "rss_after_mib": rss1, "hwm_before_mib": hwm0, "hwm_after_mib": hwm1,
                "seconds_to_queue": queued_in_s, "time_limit_s": s.queue_seconds,
                "kib_per_request": (rss1 - rss0) * 1024 / depth if depth > 0 else None}

    # ------------------------------------------------------------ classifier

    def classifier(self) -> Result | None:
        out = WORK / "classifier.json"
        WORK.mkdir(exist_ok=True)
        done = subprocess.run([sys.executable, str(BENCH / "classifier_latency.py"),
                               "--rounds", str(self.scale.classifier_rounds), "--json", str(out)],
                              capture_output=True, timeout=300, check=False)
        if done.returncode != 0:
            self.notes.append(f"classifier_latency.py failed: "
                              f"{done.stderr.decode(errors='replace')[-300:]}")
            return None
        data = orjson.loads(out.read_bytes())
        return {size: figures.get("predict (ours)") for size, figures in data["sizes"].items()}

    # ------------------------------------------------------------ Redis

    async def redis(self) -> Result | None:
        url = _redis_url("redis://127.0.0.1:6379/0")
        if url is None:
            try:
                url = self.fleet.redis()
            except RuntimeError as exc:
                self.notes.append(f"Redis: nothing answers on 127.0.0.1:6379 and no private "
                                  f"redis-server could start ({exc}); the Redis phase was "
                                  "skipped")
                return None
            self.notes.append(f"Redis: nothing answered on 127.0.0.1:6379; a private "
                              f"redis-server was started for the Redis phase ({url})")
        if not self.tools.wrk:
            self.notes.append("Redis phase skipped: needs wrk")
            return None
        s, fleet, mock = self.scale, self.fleet, self.mock
        assert mock is not None
        prefix = f"slotgate-bench-{os.getpid()}-{int(time.time())}"
        body = _body(SHORT_TOKENS, stream=False)
        rows: dict[int, list[Result]] = {1: [], 2: []}
        self.unpin()
        try:
            for r in range(s.redis_rounds):
                for workers in ((1, 2) if r % 2 == 0 else (2, 1)):
                    port = free_port()
                    coordination = (f"coordination: {{mode: redis, url: \"{url}\", "
                                    f"key_prefix: \"{prefix}-w{workers}\", "
                                    f"expected_replicas: {workers}}}\n")
                    config = slotgate_yaml(
                        port, {"primary": mock.url, "small": mock.url},
                        ledger=fleet.dir / f"ledger-redis-{workers}-{r}.sqlite3",
                        key=SLOTGATE_KEY, coordination=coordination)
                    gw = fleet.slotgate(f"slotgate-redis-w{workers}", config, port,
                                        SLOTGATE_KEY, workers)
                    try:
                        await asyncio.sleep(1.0)  # every worker listening
                        run_wrk(self.tools.wrk, gw.chat_url, body, gw.auth, s.concurrency, 1)
                        cpu0 = gw.cpu_s()
                        w = run_wrk(self.tools.wrk, gw.chat_url, body, gw.auth, s.concurrency,
                                    s.redis_seconds)
                        cpu = gw.cpu_s() - cpu0
                        rows[workers].append({
                            "rps": w["rps"], "p99_ms": w["p99_us"] / 1000, "errors": w["errors"],
                            "cpu_us_per_request": cpu / w["requests"] * 1e6
                            if w["requests"] else None})
                    finally:
                        fleet.retire(gw)
        finally:
            _redis_cleanup(url, prefix)
        return {"rounds": rows, "url": url, "key_prefix": prefix}


def _load_cpu_s() -> float:
    """CPU seconds of the load side so far: this process and its finished children (wrk)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _body(tokens: int, stream: bool) -> bytes:
    return orjson.dumps({"model": MOCK_MODEL, "max_tokens": tokens, "stream": stream,
                         "messages": [{"role": "user", "content": "Say something short."}]})


async def _queue_depth(session: aiohttp.ClientSession, gw: Server, backend: str) -> int:
    async with session.get(gw.url + "/metrics") as resp:
        text = (await resp.read()).decode()
    needle = f'llm_queue_depth_gauge{{backend="{backend}"}} '
    for line in text.splitlines():
        if line.startswith(needle):
            return int(float(line.removeprefix(needle)))
    return -1


async def _wait_held(session: aiohttp.ClientSession, sim: Server, want: int,
                     limit_s: float) -> bool:
    """Until the simulator holds `want` generations (POST /sim/hold)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        async with session.get(sim.url + "/sim/stats") as resp:
            if orjson.loads(await resp.read()).get("held", 0) >= want:
                return True
        await asyncio.sleep(0.1)
    return False


async def _wait_queue(session: aiohttp.ClientSession, gw: Server, backend: str, want: int,
                      limit_s: float) -> int:
    deadline = time.monotonic() + limit_s
    depth = await _queue_depth(session, gw, backend)
    while depth != want and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        depth = await _queue_depth(session, gw, backend)
    return depth


def _redis_url(url: str) -> str | None:
    """`url` when a Redis answers there (and redis-py is installed), else None."""
    try:
        import redis
    except ImportError:
        return None
    try:
        client = redis.Redis.from_url(url, socket_timeout=1.0)
        client.ping()
        client.close()
    except redis.RedisError:
        return None
    return url


def _redis_cleanup(url: str, prefix: str) -> None:
    """Remove the keys this run made (their prefix is unique to it)."""
    import redis

    with contextlib.suppress(redis.RedisError):
        client = redis.Redis.from_url(url, socket_timeout=2.0)
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start:start + 500])
        client.close()


async def run(args: argparse.Namespace, tools: Tools, scale: Scale) -> Result:
    pinned = len(os.sched_getaffinity(0)) >= 2 and not args.no_pin
    result: Result = {"scale": asdict(scale), "pinned": pinned}
    with Fleet() as fleet:
        suite = Suite(fleet, tools, scale, pinned)
        if pinned:
            os.sched_setaffinity(0, {LOAD_CPU})  # servers start there; place() moves them
        else:
            suite.notes.append("not pinned: fewer than 2 usable CPUs (or --no-pin)")
        phase_s: dict[str, float] = {}

        def mark(name: str, began: float) -> None:
            phase_s[name] = time.perf_counter() - began
            print(f"  {name}: {phase_s[name]:.0f} s", file=sys.stderr, flush=True)

        began = time.perf_counter()
        suite.start_peers()
        result["targets"] = [t.name for t in suite.targets]
        result["rss_start_mib"] = {t.name: t.server.rss_mib() for t in suite.targets}
        mark("start", began)
        connector = aiohttp.TCPConnector(limit=256, keepalive_timeout=60)
        async with aiohttp.ClientSession(connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=120)) as session:
            began = time.perf_counter()
            result["rounds"] = await suite.rounds(session)
            result["peak_rss_mib"] = {t.name: t.server.hwm_mib() for t in suite.targets}
            mark("rounds", began)
            began = time.perf_counter()
            result["profile"] = suite.profile()
            mark("profile", began)
            for t in list(suite.targets):  # the peers are done: free their memory and CPU
                if t.name in ("litellm", "nginx"):
                    fleet.retire(t.server)
            began = time.perf_counter()
            try:
                result["saturation"] = await suite.saturation(session)
            except (LoadError, aiohttp.ClientError, TimeoutError, OSError, RuntimeError) as exc:
                suite.notes.append(f"saturation phase failed: {exc!r:.400}")
            mark("saturation", began)
        began = time.perf_counter()
        suite.unpin()
        result["classifier"] = suite.classifier()
        mark("classifier", began)
        began = time.perf_counter()
        try:
            result["redis"] = await suite.redis()
        except (LoadError, RuntimeError, OSError) as exc:
            suite.notes.append(f"Redis phase failed: {exc!r:.400}")
        mark("redis", began)
        result["phase_seconds"] = phase_s
        result["notes"] = tools.notes + suite.notes
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short round: a smoke run")
    parser.add_argument("--rounds", type=int, help="rounds of the side-by-side phases")
    parser.add_argument("--apt", action="store_true",
                        help="apt-get install nginx and wrk when they are missing")
    parser.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out")
    parser.add_argument("--no-nginx", action="store_true", help="leave nginx out")
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    parser.add_argument("--no-doc", action="store_true",
                        help="do not rewrite docs/BENCHMARKS.md and docs/bench-peers.png")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="measure nothing: redo the report, doc and chart from the "
                             "results of an earlier run (bench/.work/suite-*.json)")
    return parser.parse_args(argv)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through Fleet: every server is stopped


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # the queued clients and, inherited, the gateway need ~2 fds each
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.render is not None:
        earlier: Result = orjson.loads(args.render.read_bytes())
        tools = Tools(tools_python=str(TOOLS_VENV / "bin" / "python")
                      if (TOOLS_VENV / "bin" / "python").exists() else None)
        finish(earlier, tools, write_doc=not args.no_doc, started=None)
        return 0
    started = time.perf_counter()
    scale = QUICK if args.quick else FULL
    if args.rounds:
        scale = Scale(**{**asdict(scale), "rounds": args.rounds})
    _raise_fd_limit()
    print(f"slotgate side-by-side suite ({'quick' if args.quick else 'full'}, "
          f"{scale.rounds} rounds)", file=sys.stderr, flush=True)
    began = time.perf_counter()
    tools = prepare(apt=args.apt, litellm=not args.no_litellm, nginx=not args.no_nginx)
    setup_s = time.perf_counter() - began
    result: Result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "machine": describe_machine(tools),
        "command": " ".join(["bench/suite.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    runner: Callable[..., Result] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    result.update(runner(run(args, tools, scale)))
    result["phase_seconds"]["setup (installs)"] = setup_s
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    result["elapsed_s"] = time.perf_counter() - started
    WORK.mkdir(exist_ok=True)
    stamp = result["date"].replace(":", "").replace("-", "")[:15]
    out = WORK / f"suite-{stamp}.json"
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    if args.json is not None:
        args.json.write_bytes(out.read_bytes())
    finish(result, tools, write_doc=not args.no_doc, started=started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
