"""Many large accepted Anthropic Messages bodies (a base64 image each) at once: how long
/healthz stalls meanwhile, and the gateway's resident memory before, at peak and after.

Starts `slotgate serve` (the embedded default config, on a free port, in a scratch
directory) with the Python given by --python (PYTHONPATH is passed through, so an older
checkout can be measured the same way), records its resident memory, sends --clients
concurrent `/v1/messages` bodies of about --mib MiB each (one image block of random
base64 and a line of text, for `llama-8b`), probes /healthz back to back (from a process
of its own) until they are all answered, and prints the statuses, the slowest /healthz
answer, and the memory: before, peak (VmHWM) and after (RSS once the flood is over and
the process has been idle for --settle seconds).

    .venv/bin/python bench/big_bodies.py [--clients 20] [--mib 7] [--python .venv/bin/python]
                                         [--external-engine] [--pin]

With --external-engine the engine is a `slotgate simulate` process of its own (as engines
are in production) and the gateway's config routes `llama-8b` to it: the stall measured is
then the gateway's alone, not the in-process simulated engine's parse of every body too.
"""


from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def messages_body(mib: float) -> bytes:
    image = base64.b64encode(os.urandom(int(mib * (1 << 20)) * 3 // 4)).decode()
    return orjson.dumps({"model": "llama-8b", "max_tokens": 16, "messages": [
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": image}},
            {"type": "text", "text": "What is in this picture?"}]}]})


CLI = "import sys; from router.cli import main; sys.exit(main())"


async def start(python: str, engine_url: str | None) -> tuple[asyncio.subprocess.Process, str]:
    scratch = Path(tempfile.mkdtemp(prefix="big-bodies-"))  # (the config's ledger file)
    config: list[str] = []
    if engine_url is not None:
        (scratch / "gateway.yaml").write_text(
            "backends:\n  engine:\n    url: " + engine_url + "/v1\n    model: m\n"
            "    slots: 32\n    queue_limit: 64\n"
            "routes:\n  llama-8b:\n    primary: engine\n", encoding="utf-8")
        config = ["--config", "gateway.yaml"]
    proc = await asyncio.create_subprocess_exec(
        python, "-c", CLI, "serve", *config, "--port", "0", "--log-level", "INFO",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=os.environ.copy(),
        cwd=scratch)
    assert proc.stdout is not None
    async with asyncio.timeout(60):
        while b"listening on" not in (line := await proc.stdout.readline()):
            if not line:
                raise SystemExit("slotgate serve exited before listening")
    return proc, line.decode().split("listening on ")[1].split()[0]


async def start_engine(python: str) -> tuple[asyncio.subprocess.Process, str]:
    """A `slotgate simulate` engine of its own: 32 sequences, instant, 16 tokens."""
    proc = await asyncio.create_subprocess_exec(
        python, "-c", CLI, "simulate", "--port", "0", "--model", "m", "--slots", "32",
        "--ttft-s", "0", "--tokens-per-s", "0", "--output-tokens", "16",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=os.environ.copy())
    assert proc.stdout is not None
    async with asyncio.timeout(60):
        line = (await proc.stdout.readline()).decode()
    if " on http" not in line:
        raise SystemExit("slotgate simulate exited before listening")
    return proc, line.split(" on ")[-1].strip()


# Probes /healthz back to back in a process of its own (the sender's event loop is busy
# writing bodies) until its stdin closes; prints the slowest answer, the 99th percentile
# (seconds), the number of probes and how many took over 50 ms.
PROBE = """
import sys, threading, time, urllib.request
url, stop, took = sys.argv[1], threading.Event(), []
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
print("ready", flush=True)
while not stop.is_set():
    asked = time.perf_counter()
    urllib.request.urlopen(url, timeout=60).read()
    took.append(time.perf_counter() - asked)
took.sort()
print(took[-1], took[int(len(took) * 0.99)], len(took), sum(t > 0.05 for t in took), flush=True)
"""


def pin(pid: int, cpu: int) -> None:
    """Process `pid` and its threads on `cpu` alone."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), {cpu})


def loop_stalls(exposition: str) -> str:
    """`slotgate_event_loop_stall_seconds` read: how many stalls, how many past 50 ms, the
    longest's bucket (absent in an older gateway)."""
    buckets: list[tuple[float, float]] = []
    for line in exposition.splitlines():
        if line.startswith("slotgate_event_loop_stall_seconds_bucket"):
            bound = line.split('le="')[1].split('"')[0]
            buckets.append((float(bound), float(line.rsplit(" ", 1)[1])))
    if not buckets:
        return "not measured (no such metric)"
    count = buckets[-1][1]
    upto_50 = next(n for bound, n in buckets if bound >= 0.05)
    longest = next(bound for bound, n in buckets if n == count)
    return (f"{count:.0f} stalls, {count - upto_50:.0f} over 50 ms, the longest at most "
            f"{longest * 1000:.0f} ms")


async def drain(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdout is not None
    while await proc.stdout.readline():
        pass


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--mib", type=float, default=7.0)
    parser.add_argument("--settle", type=float, default=2.0)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--external-engine", action="store_true")
    parser.add_argument("--pin", action="store_true",
                        help="the gateway alone on CPU 0, everything else on the others "
                             "(its stalls measured, not the machine's contention)")
    args = parser.parse_args()
    others = set(range(1, os.cpu_count() or 2)) or {0}
    if args.pin:
        os.sched_setaffinity(0, others)  # this process and what it starts, but the gateway
    body = messages_body(args.mib)
    engine = None
    if args.external_engine:
        engine, engine_url = await start_engine(args.python)
        engine_reading = asyncio.create_task(drain(engine))
    proc, url = await start(args.python, engine_url if engine is not None else None)
    if args.pin:
        pin(proc.pid, 0)
    reading = asyncio.create_task(drain(proc))
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/healthz") as resp:
                await resp.read()
            before_kib = status_kib(proc.pid, "VmRSS")

            async def send() -> int:
                async with http.post(url + "/v1/messages", data=body,
                                     headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    return resp.status

            probe = await asyncio.create_subprocess_exec(
                sys.executable, "-c", PROBE, url + "/healthz", stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE)
            assert probe.stdin is not None and probe.stdout is not None
            await probe.stdout.readline()
            began = time.perf_counter()
            statuses = collections.Counter(
                await asyncio.gather(*(send() for _ in range(args.clients))))
            elapsed = time.perf_counter() - began
            probe.stdin.close()
            slowest, p99, probes, over = (await probe.stdout.readline()).decode().split()
            await probe.wait()
            peak_kib = status_kib(proc.pid, "VmHWM")
            async with http.get(url + "/metrics") as resp:
                stalls = loop_stalls(await resp.text())
            await asyncio.sleep(args.settle)  # (a bench: the process left idle, not a sync)
            after_kib = status_kib(proc.pid, "VmRSS")
    finally:
        proc.terminate()
        await proc.wait()
        await reading
        if engine is not None:
            engine.terminate()
            await engine.wait()
            await engine_reading
    print(f"{args.clients} x {len(body) / (1 << 20):.1f} MiB bodies: statuses "
          f"{dict(statuses)}, all answered in {elapsed:.2f} s")
    print(f"slowest /healthz meanwhile: {float(slowest) * 1000:.0f} ms (p99 "
          f"{float(p99) * 1000:.0f} ms; {over} of {probes} probes over 50 ms)")
    print(f"the gateway's loop stalled (slotgate_event_loop_stall_seconds): {stalls}")
    print(f"memory: {before_kib / 1024:.0f} MiB before, peak {peak_kib / 1024:.0f} MiB, "
          f"after {after_kib / 1024:.0f} MiB")


if __name__ == "__main__":
    asyncio.run(main())
