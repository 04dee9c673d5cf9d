"""What slotgate adds on top of a fast backend: direct vs through the gateway, same run.

    .venv/bin/python bench/overhead.py [--quick] [--json FILE] [--gateway-log-level LEVEL]

Starts a zero-think-time simulated engine and a gateway in their own processes and
drives both from this process (aiohttp client, uvloop when installed). Every figure is
given next to the direct baseline measured in the same run. See docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

# Run as a script, so this directory is on sys.path and the siblings import by name.
from harness import BackendSpec, Processes, Server, cpu_window
from load import (
    Target,
    Throughput,
    closed_loop,
    handoff_gaps,
    interleaved_latency,
    new_session,
    percentile,
    stream_relay,
    tagged_requests,
)
from report import machine, print_report, targets

Result = dict[str, Any]
FAST, HANDOFF = "fast", "handoff"  # the gateway's two routes (and backends)
CHAT = "/v1/chat/completions"
SHORT_TOKENS = 16  # output tokens of the latency requests and short streams
SIM_SEQS = 4096  # the engine itself never limits concurrency


@dataclass(frozen=True)
class Scale:
    """How much of everything; --quick divides by about five."""

    latency_blocks: int  # alternating blocks per target (plus one warm-up block)
    latency_block: int  # sequential requests per block
    throughput_rounds: int  # direct, gateway, direct, gateway ...
    throughput_s: float  # timed seconds per round and target
    concurrency: int
    stream_rounds: int
    stream_s: float  # seconds per round and target
    stream_tokens: int
    stream_clients: int
    handoff_direct: int  # back-to-back requests of the one direct client
    handoff_gateway: int  # requests through the slots=1 backend
    handoff_clients: int
    phase_limit_s: float  # no loop runs longer than this


FULL = Scale(latency_blocks=60, latency_block=50, throughput_rounds=3, throughput_s=6.0,
             concurrency=64, stream_rounds=2, stream_s=4.0, stream_tokens=500, stream_clients=4,
             handoff_direct=2000, handoff_gateway=4000, handoff_clients=20, phase_limit_s=40.0)
QUICK = Scale(latency_blocks=8, latency_block=50, throughput_rounds=1, throughput_s=2.5,
              concurrency=64, stream_rounds=1, stream_s=1.5, stream_tokens=500, stream_clients=4,
              handoff_direct=400, handoff_gateway=800, handoff_clients=20, phase_limit_s=10.0)


@dataclass(frozen=True)
class Setup:
    sim: Server
    gateway: Server
    direct: Target
    through: Target  # the gateway's large-slot route
    handoff: Target  # the gateway's slots=1 route


def summary_ms(values: Sequence[float]) -> Result:
    return {"n": len(values), "p50": percentile(values, 50) * 1000,
            "p99": percentile(values, 99) * 1000}


def compare_latency(samples: dict[str, list[float]]) -> Result:
    direct, gateway = summary_ms(samples["direct"]), summary_ms(samples["gateway"])
    added = {q: gateway[q] - direct[q] for q in ("p50", "p99")}
    return {"direct_ms": direct, "gateway_ms": gateway, "added_ms": added}


async def measure_latency(session: aiohttp.ClientSession, s: Setup, scale: Scale) -> Result:
    out: Result = {}
    for name, stream in (("non_stream", False), ("short_stream", True)):
        with cpu_window([s.gateway]) as cpu:  # the gateway idles while the direct blocks run
            samples = await interleaved_latency(
                session, [s.direct, s.through], SHORT_TOKENS, stream,
                scale.latency_blocks, scale.latency_block, scale.phase_limit_s)
        out[name] = compare_latency(samples)
        sent = len(samples["gateway"]) + scale.latency_block  # plus the warm-up block
        out[name]["gateway_cpu_us_per_request"] = cpu["gateway"] / sent * 1e6
    return out


def per_unit_us(cpu: dict[str, float], units: int) -> dict[str, float]:
    return {name: secs / units * 1e6 for name, secs in cpu.items()} if units else {}


def busy(cpu: dict[str, float], elapsed_s: float) -> dict[str, float]:
    """Each process's CPU time as a share of one core: ~1.0 is that process's limit."""
    return {name: secs / elapsed_s for name, secs in cpu.items()} if elapsed_s else {}


async def measure_throughput(session: aiohttp.ClientSession, s: Setup, scale: Scale) -> Result:
    totals = {"direct": Throughput(), "gateway": Throughput()}
    cpu_sum: dict[str, dict[str, float]] = {"direct": {}, "gateway": {}}
    rounds: list[Result] = []
    for _ in range(scale.throughput_rounds):
        for target in (s.direct, s.through):
            # warm-up: open the connections, let the pools settle; not counted
            await closed_loop(session, target, scale.concurrency, 0.5, 10**9, SHORT_TOKENS)
            with cpu_window([s.sim, s.gateway]) as cpu:
                r = await closed_loop(session, target, scale.concurrency, scale.throughput_s,
                                      int(scale.throughput_s * 50_000), SHORT_TOKENS)
            rounds.append({"target": target.name, "rps": r.per_s, "errors": r.errors})
            total = totals[target.name]
            total.requests += r.requests
            total.errors += r.errors
            total.elapsed_s += r.elapsed_s
            total.first_error = total.first_error or r.first_error
            for proc, secs in cpu.items():
                cpu_sum[target.name][proc] = cpu_sum[target.name].get(proc, 0.0) + secs
    gw, direct = totals["gateway"], totals["direct"]
    gw_cpu_us = per_unit_us(cpu_sum["gateway"], gw.requests).get("gateway", 0.0)
    return {
        "concurrency": scale.concurrency, "direct_rps": direct.per_s, "gateway_rps": gw.per_s,
        "ratio": gw.per_s / direct.per_s if direct.per_s else 0.0,
        "errors": direct.errors + gw.errors, "first_error": direct.first_error or gw.first_error,
        "rounds": rounds,
        "cpu_us_per_request": {t: per_unit_us(cpu_sum[t], totals[t].requests) for t in totals},
        "busy": {t: busy(cpu_sum[t], totals[t].elapsed_s) for t in totals},
        # what one fully busy core could carry at this CPU cost: steadier than rps when noisy
        "gateway_rps_per_core": 1e6 / gw_cpu_us if gw_cpu_us else 0.0,
    }


async def measure_streams(session: aiohttp.ClientSession, s: Setup, scale: Scale) -> Result:
    out: Result = {"clients": scale.stream_clients, "tokens": scale.stream_tokens}
    sums: dict[str, dict[str, float]] = {}
    for _ in range(scale.stream_rounds):
        for target in (s.direct, s.through):
            with cpu_window([s.sim, s.gateway]) as cpu:
                r = await stream_relay(session, target, scale.stream_clients,
                                       scale.stream_tokens, 10**6, scale.stream_s)
            acc = sums.setdefault(target.name, {"events": 0, "bytes": 0, "elapsed_s": 0.0,
                                                "streams": 0})
            acc["events"] += r.events
            acc["bytes"] += r.bytes
            acc["elapsed_s"] += r.elapsed_s
            acc["streams"] += r.streams
            for proc, secs in cpu.items():
                acc["cpu_" + proc] = acc.get("cpu_" + proc, 0.0) + secs
    for name, acc in sums.items():
        cpu_s = {k.removeprefix("cpu_"): v for k, v in acc.items() if k.startswith("cpu_")}
        out[name] = {"streams": acc["streams"], "events_per_s": acc["events"] / acc["elapsed_s"],
                     "mib_per_s": acc["bytes"] / acc["elapsed_s"] / 2**20,
                     "busy": busy(cpu_s, acc["elapsed_s"])}
    out["ratio"] = out["gateway"]["events_per_s"] / out["direct"]["events_per_s"]
    gw = sums["gateway"]
    out["gateway_cpu_us_per_event"] = gw["cpu_gateway"] / gw["events"] * 1e6
    return out


async def engine_records(session: aiohttp.ClientSession, sim: Server) -> list[dict[str, Any]]:
    async with session.get(sim.url + "/sim/requests") as resp:
        records: list[dict[str, Any]] = orjson.loads(await resp.read())
        return records


async def measure_handoff(session: aiohttp.ClientSession, s: Setup, scale: Scale) -> Result:
    """Engine idle time between consecutive requests: one direct client vs a full queue."""
    async with session.post(s.sim.url + "/sim/reset") as resp:
        resp.raise_for_status()
    await tagged_requests(session, s.direct, 1, scale.handoff_direct, scale.phase_limit_s,
                          "ho-direct")
    done = await tagged_requests(session, s.handoff, scale.handoff_clients,
                                 scale.handoff_gateway, scale.phase_limit_s, "ho-gateway")
    records = await engine_records(session, s.sim)
    skip = scale.handoff_clients  # the first requests find the queue still filling
    direct = handoff_gaps(records, "ho-direct-", skip)
    gateway = handoff_gaps(records, "ho-gateway-", skip)[: -scale.handoff_clients]  # the drain
    out = compare_latency({"direct": direct, "gateway": gateway})
    out["clients"] = scale.handoff_clients
    out["gateway_requests"] = done
    out["gateway_min_gap_ms"] = min(gateway) * 1000 if gateway else float("nan")
    out["engine_overlaps"] = sum(gap < 0 for gap in gateway)  # must be 0 with slots: 1
    return out


async def run(scale: Scale, log_level: str) -> Result:
    with Processes() as procs:
        sim = procs.start_simulator(SIM_SEQS, scale.stream_tokens)
        gateway = procs.start_gateway(sim.url, [BackendSpec(FAST, 100_000, 0),
                                                BackendSpec(HANDOFF, 1, 10_000)], log_level)
        setup = Setup(sim, gateway, Target("direct", sim.url + CHAT, "sim"),
                      Target("gateway", gateway.url + CHAT, FAST),
                      Target("gateway", gateway.url + CHAT, HANDOFF))
        result: Result = {"rss_mib": {"gateway_start": gateway.rss_mib()}}
        phases: list[tuple[str, Callable[..., Coroutine[Any, Any, Result]]]] = [
            ("latency", measure_latency), ("throughput", measure_throughput),
            ("stream_relay", measure_streams), ("handoff", measure_handoff)]
        async with new_session(scale.concurrency + scale.handoff_clients) as session:
            for name, phase in phases:
                started = time.perf_counter()
                print(f"  {name} ...", end="", flush=True, file=sys.stderr)
                result[name] = await phase(session, setup, scale)
                print(f" {time.perf_counter() - started:.1f} s", file=sys.stderr)
        result["rss_mib"].update(gateway_end=gateway.rss_mib(), simulator_end=sim.rss_mib())
        return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about 5x smaller: a smoke run")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--gateway-log-level", default="INFO",
                        help="the gateway's --log-level (INFO, its default, logs every request)")
    return parser.parse_args(argv)


def event_loop_runner() -> Callable[[Coroutine[Any, Any, Result]], Result]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through Processes: the servers are stopped


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    scale = QUICK if args.quick else FULL
    started = time.perf_counter()
    result: Result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full", "gateway_log_level": args.gateway_log_level,
        "machine": machine(), "scale": asdict(scale),
    }
    print(f"slotgate overhead benchmark ({result['mode']})", file=sys.stderr)
    result.update(event_loop_runner()(run(scale, args.gateway_log_level)))
    result["targets"] = targets(result)
    result["elapsed_s"] = time.perf_counter() - started
    result["machine"]["loadavg_end"] = machine()["loadavg"]
    print_report(result)
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
