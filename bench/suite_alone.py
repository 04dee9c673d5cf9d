"""The suite's slotgate-alone phases: a py-spy profile under the c=64 load, slot hand-off
and memory per queued streaming request under saturation (on a gateway of its own over
slotgate's simulator), tracing's cost (off, sample ratio 1 and 0.1), classifier latency,
and requests/s with Redis coordination for 1 and 2 processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from typing import Any

import aiohttp
import orjson
from harness import HOST, free_port
from load import Target as TaggedTarget
from load import handoff_gaps, tagged_requests
from peer_configs import MOCK_MODEL, slotgate_yaml
from peers import BENCH, Server
from suite_load import LoadError, park_streams, run_wrk, summarise
from suite_phases import LOAD_CPU, SHORT_TOKENS, SLOTGATE_KEY, WORK, Suite, chat_body
from suite_profile import parse as parse_profile
from suite_profile import summary as profile_summary
from tracing_arms import SUITE_ARMS, Sink, run_rounds, start_arm

Result = dict[str, Any]
HELD_PROMPT = "Prove that there are infinitely many primes, with every step justified."


def profile(suite: Suite) -> Result | None:
    """py-spy on slotgate while wrk holds it at c=64 (not during the measured rounds)."""
    if not (suite.tools.py_spy and suite.tools.wrk):
        suite.notes.append("profile skipped: needs py-spy and wrk")
        return None
    gw = next(t.server for t in suite.targets if t.name == "slotgate")
    suite.place(gw)
    WORK.mkdir(exist_ok=True)
    raw = WORK / "profile-c64.txt"
    s = suite.scale
    load = {LOAD_CPU} if suite.pinned else None
    wrk = subprocess.Popen(
        [*(["taskset", "-c", str(LOAD_CPU)] if load else []), suite.tools.wrk, "-t1",
         f"-c{s.concurrency}", f"-d{s.profile_seconds + 3}s", "-s",
         str(BENCH / "wrk_post.lua"), gw.chat_url],
        env={**os.environ, "BENCH_BODY": chat_body(SHORT_TOKENS, False).decode(),
             "BENCH_AUTH": gw.auth},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        spy = subprocess.run(
            [*(["taskset", "-c", str(LOAD_CPU)] if load else []), suite.tools.py_spy,
             "record", "--pid", str(gw.pid), "--rate", "250", "--duration",
             str(s.profile_seconds), "--threads", "--nolineno", "--format", "raw",
             "--output", str(raw)],
            capture_output=True, timeout=s.profile_seconds + 60, check=False)
    finally:
        wrk.wait(timeout=s.profile_seconds + 60)
    if spy.returncode != 0 or not raw.exists():
        suite.notes.append(f"py-spy failed: {spy.stderr.decode(errors='replace')[-300:]}")
        return None
    summary = profile_summary(parse_profile(raw.read_text()), top=15)
    summary["raw_file"] = str(raw.relative_to(BENCH.parent))
    summary["seconds"] = s.profile_seconds
    summary["rate_hz"] = 250
    return summary


async def saturation(suite: Suite, session: aiohttp.ClientSession) -> Result:
    """Slot hand-off and memory per queued request, on a gateway of their own over
    slotgate's simulator (records of every request; can hold every generation)."""
    s, fleet = suite.scale, suite.fleet
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
                           extra_routes=extra_routes,
                           connections=s.queued + 1000)  # (all from this one address)
    gw = fleet.slotgate("slotgate-saturation", config, port, SLOTGATE_KEY)
    suite.place(gw)
    out: Result = {"handoff": await _handoff(suite, session, sim, gw)}
    out["queue_memory"] = await _queue_memory(suite, session, sim, gw, port)
    fleet.retire(sim)
    return out


async def _handoff(suite: Suite, session: aiohttp.ClientSession, sim: Server, gw: Server) -> Result:
    s = suite.scale
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


async def _queue_memory(suite: Suite, session: aiohttp.ClientSession, sim: Server, gw: Server,
                        port: int) -> Result:
    s = suite.scale
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
        suite.fleet.retire(gw)
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


def tracing(suite: Suite) -> Result | None:
    """CPU per request with tracing off, on at sample ratio 1 and at 0.1: one gateway per
    arm (the suite's slotgate config, exporting OTLP/HTTP to a sink in this process), wrk
    at c=64 per arm and round in rotating order (bench/tracing_arms.py; the standalone,
    longer bench/tracing_overhead.py adds the SDK exporter's arm)."""
    if not suite.tools.wrk:
        suite.notes.append("tracing phase skipped: needs wrk")
        return None
    s, fleet, mock = suite.scale, suite.fleet, suite.mock
    assert mock is not None
    load = {LOAD_CPU} if suite.pinned else None
    body = chat_body(SHORT_TOKENS, stream=False)
    with Sink() as sink:  # its thread starts on LOAD_CPU, as this thread is there
        servers = {arm: start_arm(fleet, arm, mock.url, sink, SLOTGATE_KEY, log_level="INFO")
                   for arm in SUITE_ARMS}
        try:
            rounds = run_rounds(suite.tools.wrk, servers, body, s.tracing_rounds,
                                s.tracing_seconds, suite.place, load,
                                lambda line: print(f"  tracing {line}", file=sys.stderr,
                                                   flush=True))
        finally:
            for server in servers.values():  # before the sink: they flush into it
                fleet.retire(server)
        for row in rounds:
            for arm in SUITE_ARMS:
                if "error" in row.get(arm, {}):
                    suite.notes.append(f"tracing {arm}: {row[arm]['error']}")
    return {"rounds": rounds, "seconds": s.tracing_seconds,
            "sink": {"exports": sink.exports, "bytes": sink.bytes}}


def classifier(suite: Suite) -> Result | None:
    out = WORK / "classifier.json"
    WORK.mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, str(BENCH / "classifier_latency.py"),
                           "--rounds", str(suite.scale.classifier_rounds), "--json", str(out)],
                          capture_output=True, timeout=300, check=False)
    if done.returncode != 0:
        suite.notes.append(f"classifier_latency.py failed: "
                          f"{done.stderr.decode(errors='replace')[-300:]}")
        return None
    data = orjson.loads(out.read_bytes())
    return {size: figures.get("predict (ours)") for size, figures in data["sizes"].items()}


async def redis(suite: Suite) -> Result | None:
    url = _redis_url("redis://127.0.0.1:6379/0")
    if url is None:
        try:
            url = suite.fleet.redis()
        except RuntimeError as exc:
            suite.notes.append(f"Redis: nothing answers on 127.0.0.1:6379 and no private "
                              f"redis-server could start ({exc}); the Redis phase was "
                              "skipped")
            return None
        suite.notes.append(f"Redis: nothing answered on 127.0.0.1:6379; a private "
                          f"redis-server was started for the Redis phase ({url})")
    if not suite.tools.wrk:
        suite.notes.append("Redis phase skipped: needs wrk")
        return None
    s, fleet, mock = suite.scale, suite.fleet, suite.mock
    assert mock is not None
    prefix = f"slotgate-bench-{os.getpid()}-{int(time.time())}"
    body = chat_body(SHORT_TOKENS, stream=False)
    rows: dict[int, list[Result]] = {1: [], 2: []}
    suite.unpin()
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
                    run_wrk(suite.tools.wrk, gw.chat_url, body, gw.auth, s.concurrency, 1)
                    cpu0 = gw.cpu_s()
                    w = run_wrk(suite.tools.wrk, gw.chat_url, body, gw.auth, s.concurrency,
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


async def _queue_depth(session: aiohttp.ClientSession, gw: Server, backend: str) -> int:
    async with session.get(gw.url + "/metrics", headers={"Authorization": gw.auth}) as resp:
        resp.raise_for_status()  # (with auth on, /metrics asks for a key too)
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
