"""Redis coordination: what a shared slot costs, and what a second process buys.

    .venv/bin/python bench/redis_pool.py [--rounds N] [--seconds S]

1. Acquire + release round trip, one at a time: `LocalSlotPool` (the baseline) against
   `RedisSlotPool` on a private redis-server on loopback, interleaved A B A B over rounds.
   Target: Redis p99 <= 2 ms.
2. Requests/s through `slotgate serve --workers 1` against `--workers 2`, both with
   `coordination.mode: redis`, against a fast simulated engine (slots not a bottleneck),
   closed loop at concurrency 64, interleaved over rounds. Target: 2 processes >= 1.6x.
   On a 2-core machine the load generator shares the cores with the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import free_port, slotgate_command  # noqa: E402
from load import Target, closed_loop, new_session  # noqa: E402
from report import machine  # noqa: E402

from policies.clock.holds import HoldTimeModel  # noqa: E402
from policies.health.breaker import CircuitBreaker  # noqa: E402
from policies.slots import LocalSlotPool  # noqa: E402
from policies.slots.coordinator import RedisCoordinator  # noqa: E402
from policies.slots.redis import RedisSlotPool  # noqa: E402

ROUND_TRIPS = 2000


def start_redis() -> tuple[subprocess.Popen[bytes], str]:
    program = shutil.which("redis-server")
    if program is None:
        sys.exit("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen([program, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    for line in proc.stdout:  # its own word that it listens
        if b"Ready to accept connections" in line:
            break
    return proc, f"redis://127.0.0.1:{port}/0"


async def round_trips(pool: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        began = time.perf_counter()
        lease = await pool.try_acquire()
        await lease.release()
        out.append((time.perf_counter() - began) * 1e3)
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def pools(redis_url: str, rounds: int) -> dict[str, Any]:
    local = LocalSlotPool("bench", 64, 0, HoldTimeModel(1.0))
    coordinator = RedisCoordinator(redis_url, "bench", 0.5,
                                   CircuitBreaker(3, 5.0, time.monotonic))
    shared = RedisSlotPool("bench", 64, 0, HoldTimeModel(1.0), coordinator, 15.0, 1.0)
    coordinator.start()
    try:
        await round_trips(shared, 200)  # load the scripts, open the connections
        a: list[float] = []
        b: list[float] = []
        for _ in range(rounds):
            a += await round_trips(local, ROUND_TRIPS)
            b += await round_trips(shared, ROUND_TRIPS)
    finally:
        await coordinator.close()
    return {"local_ms": {"p50": pct(a, 0.5), "p99": pct(a, 0.99)},
            "redis_ms": {"p50": pct(b, 0.5), "p99": pct(b, 0.99)}}


def gateway_yaml(port: int, sim_url: str, redis_url: str, workers: int) -> str:
    return f"""server: {{host: 127.0.0.1, port: {port}, shutdown_timeout_s: 2}}
logging: {{access: true}}
coordination: {{mode: redis, url: "{redis_url}", key_prefix: "bench{workers}",
               expected_replicas: {workers}}}
backends:
  sim: {{url: "{sim_url}/v1", model: sim, slots: 1024, queue_limit: 1024}}
routes:
  sim: {{primary: sim, overflow: reject}}
"""


def start(args: list[str], ready: bytes, count: int = 1) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([*slotgate_command(), *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        seen += ready in line
        if seen >= count:
            break
    else:
        sys.exit(f"{args[0]} did not start")
    # the access log goes on: keep the pipe empty so the server never blocks on it
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def throughput(url: str, seconds: float) -> float:
    async with new_session(64) as session:
        result = await closed_loop(session, Target("gateway", url, "sim"), 64, seconds,
                                   10**9, 8)
    if result.errors:
        sys.exit(f"{result.errors} requests failed: {result.first_error}")
    return result.per_s


async def processes(redis_url: str, rounds: int, seconds: float) -> dict[str, Any]:
    sim_port = free_port()
    sim = start(["simulate", "--host", "127.0.0.1", "--port", str(sim_port), "--slots", "4096",
                 "--ttft-s", "0", "--tokens-per-s", "0", "--output-tokens", "8",
                 "--model", "sim"], b" seqs on ")
    rps: dict[int, list[float]] = {1: [], 2: []}
    try:
        with tempfile.TemporaryDirectory() as folder:
            for _ in range(rounds):
                for workers in (1, 2):
                    port = free_port()
                    config = Path(folder) / f"w{workers}.yaml"
                    config.write_text(gateway_yaml(port, f"http://127.0.0.1:{sim_port}",
                                                   redis_url, workers))
                    gw = start(["serve", "--config", str(config), "--workers", str(workers),
                                "--log-level", "INFO"], b"listening on", workers)
                    try:
                        url = f"http://127.0.0.1:{port}/v1/chat/completions"
                        await throughput(url, 1.0)  # warm up both processes' connections
                        rps[workers].append(await throughput(url, seconds))
                    finally:
                        stop(gw)
    finally:
        stop(sim)
    one, two = statistics.median(rps[1]), statistics.median(rps[2])
    return {"rps_1": one, "rps_2": two, "ratio": two / one, "rounds": rps}


async def main(rounds: int, seconds: float) -> None:
    print(machine())
    redis, url = start_redis()
    try:
        trips = await pools(url, rounds)
        local, shared = trips["local_ms"], trips["redis_ms"]
        print(f"acquire + release, {rounds} x {ROUND_TRIPS} interleaved:")
        for label, figures in (("local pool", local), ("Redis pool", shared)):
            print(f"  {label}  p50 {figures['p50'] * 1000:7.1f} us  "
                  f"p99 {figures['p99'] * 1000:7.1f} us")
        print(f"  Redis / local at p50: x{shared['p50'] / local['p50']:.0f}")
        procs = await processes(url, rounds, seconds)
        print(f"requests/s, closed loop c=64, {rounds} rounds of {seconds:g} s, median:")
        print(f"  --workers 1  {procs['rps_1']:8.0f}   {procs['rounds'][1]}")
        print(f"  --workers 2  {procs['rps_2']:8.0f}   {procs['rounds'][2]}"
              f"   (x{procs['ratio']:.2f})")
    finally:
        redis.terminate()
        redis.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.seconds))
