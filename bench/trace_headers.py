"""What large W3C trace context headers cost a traced gateway: requests per second with a
sampled `traceparent` alone, and with 16 KB more of `tracestate` (8 KB) and `baggage`
(8 KB), same gateway, alternating rounds.

Starts `slotgate serve` with tracing on (OTLP/HTTP to a sink in this process, which
answers every export at once) in front of a simulated engine that answers at once, with
the Python given by --python (PYTHONPATH passed through, so an older checkout can be
measured the same way); --clients concurrent aiohttp clients in this process send
non-streaming chat requests for --seconds per round. Prints each arm's median req/s.

    .venv/bin/python bench/trace_headers.py [--rounds 4] [--seconds 4] [--clients 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STATE = ",".join(f"v{i}=" + "s" * 26 for i in range(8192 // 30))[:8000]
BAGGAGE = ",".join(f"k{i}=" + "b" * 26 for i in range(8192 // 30))[:8000]
BODY = orjson.dumps({"model": "chat", "max_tokens": 1,
                     "messages": [{"role": "user", "content": "hi"}]})


def config(sink: str) -> str:
    return f"""
server: {{host: 127.0.0.1, port: 0}}
tracing: {{enabled: true, otlp_endpoint: "{sink}", sample_ratio: 1.0}}
backends:
  fast:
    simulated: {{max_num_seqs: 1024, ttft_s: 0, tokens_per_s: 0, output_tokens: 1}}
    model: m
    slots: 1024
    queue_limit: 1024
routes:
  chat: {{primary: fast}}
"""


async def start(python: str, path: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        python, "-c", "import sys; from router.cli import main; sys.exit(main())", "serve",
        "--config", path, "--port", "0", "--log-level", "INFO",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env=os.environ.copy())
    assert proc.stdout is not None
    async with asyncio.timeout(60):
        while b"listening on" not in (line := await proc.stdout.readline()):
            if not line:
                raise SystemExit("slotgate serve exited before listening")
    return proc, line.decode().split("listening on ")[1].split()[0]


async def drain(proc: asyncio.subprocess.Process) -> None:
    assert proc.stdout is not None
    while await proc.stdout.readline():
        pass


async def rate(url: str, headers: dict[str, str], clients: int, seconds: float) -> float:
    done = 0
    stop = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as http:
        async def one() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                async with http.post(url + "/v1/chat/completions", data=BODY,
                                     headers=headers) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status
                done += 1

        began = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(clients)))
        return done / (time.perf_counter() - began)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    sink = web.Application()
    sink.router.add_post("/v1/traces", lambda _: web.Response(status=200))
    runner = web.AppRunner(sink)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    path = Path(tempfile.mkdtemp(prefix="trace-headers-")) / "config.yaml"
    path.write_text(config(f"http://127.0.0.1:{port}/v1/traces"))
    proc, url = await start(args.python, str(path))
    reading = asyncio.create_task(drain(proc))
    base = {"Content-Type": "application/json", "traceparent": TRACEPARENT}
    arms = {"traceparent only": base,
            "+ 16 KB tracestate/baggage": {**base, "tracestate": STATE, "baggage": BAGGAGE}}
    figures: dict[str, list[float]] = {name: [] for name in arms}
    try:
        await rate(url, base, args.clients, 1.0)  # warm-up
        for _ in range(args.rounds):
            for name, headers in arms.items():
                figures[name].append(await rate(url, headers, args.clients, args.seconds))
    finally:
        proc.terminate()
        await proc.wait()
        await reading
        await runner.cleanup()
    for name, runs in figures.items():
        print(f"{name}: {statistics.median(runs):.0f} req/s "
              f"(rounds {', '.join(f'{r:.0f}' for r in runs)})")


if __name__ == "__main__":
    asyncio.run(main())
