"""The suite's load generators: wrk for throughput, small asyncio clients for the rest.

- `latency_c1`: sequential non-streaming requests (aiohttp, keep-alive), time to last byte;
- `streams`: N concurrent clients reading long streams back to back: data events per
  second and the time to the first `data:` event (TTFC) of every stream;
- `run_wrk`: wrk with bench/wrk_post.lua at a fixed concurrency, its summary as a dict;
- `park_streams`: thousands of raw-socket streaming requests that stay open (queued).

Every loop is bounded in count and in time; every address is loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

WRK_SCRIPT = Path(__file__).resolve().parent / "wrk_post.lua"
PROMPT = "Say something short."


def chat_body(model: str, max_tokens: int, stream: bool, prompt: str = PROMPT) -> bytes:
    return orjson.dumps({"model": model, "max_tokens": max_tokens, "stream": stream,
                         "messages": [{"role": "user", "content": prompt}]})


def headers_for(auth: str) -> dict[str, str]:
    out = {"Content-Type": "application/json"}
    if auth:
        out["Authorization"] = auth
    return out


class LoadError(Exception):
    """A request the measurement relies on failed."""


async def latency_c1(session: aiohttp.ClientSession, url: str, auth: str, body: bytes,
                     count: int, time_limit_s: float, warmup: int = 20) -> list[float]:
    """Seconds from send to the last byte of `count` sequential requests (after `warmup`)."""
    headers = headers_for(auth)
    out: list[float] = []
    stop_at = time.perf_counter() + time_limit_s
    for i in range(warmup + count):
        started = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as resp:
            data = await resp.read()
            if resp.status != 200:
                raise LoadError(f"{url}: HTTP {resp.status}: {data[:300]!r}")
        if i >= warmup:
            out.append(time.perf_counter() - started)
            if time.perf_counter() > stop_at:
                break
    return out


@dataclass
class StreamRun:
    streams: int = 0
    events: int = 0
    elapsed_s: float = 0.0
    ttfc_s: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str | None = None

    @property
    def events_per_s(self) -> float:
        return self.events / self.elapsed_s if self.elapsed_s else 0.0


async def _one_stream(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str],
                      body: bytes) -> tuple[int, float]:
    """(data events before [DONE], seconds to the first data event) of one stream."""
    started = time.perf_counter()
    first = 0.0
    events = 0
    tail = end = b""
    async with session.post(url, data=body, headers=headers) as resp:
        if resp.status != 200:
            raise LoadError(f"{url}: HTTP {resp.status}: {(await resp.read())[:300]!r}")
        async for chunk in resp.content.iter_any():
            joined = tail + chunk  # a 5-byte tail cannot hold a whole "data: "
            found = joined.count(b"data: ")
            if found and not first:
                first = time.perf_counter() - started
            events += found
            tail = joined[-5:]
            end = (end + chunk)[-16:]
    if not end.endswith(b"data: [DONE]\n\n"):
        raise LoadError(f"{url}: stream ended without [DONE]")
    return events - 1, first  # [DONE] is no chunk


async def streams(session: aiohttp.ClientSession, url: str, auth: str, body: bytes,
                  clients: int, time_limit_s: float, max_streams: int = 10_000) -> StreamRun:
    """`clients` workers read streams back to back; each stops after the time limit."""
    headers = headers_for(auth)
    run = StreamRun()
    stop_at = time.perf_counter() + time_limit_s
    started_streams = 0

    async def worker() -> None:
        nonlocal started_streams
        while time.perf_counter() < stop_at and started_streams < max_streams:
            started_streams += 1
            try:
                events, first = await _one_stream(session, url, headers, body)
            except (LoadError, aiohttp.ClientError, TimeoutError) as exc:
                run.errors += 1
                run.first_error = run.first_error or repr(exc)
                continue
            run.streams += 1
            run.events += events
            run.ttfc_s.append(first)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    run.elapsed_s = time.perf_counter() - began
    return run


def run_wrk(wrk: str, url: str, body: bytes, auth: str, connections: int, seconds: int,
            cpus: set[int] | None = None) -> dict[str, Any]:
    """One wrk run (one thread); the summary printed by wrk_post.lua's done()."""
    env = {**os.environ, "BENCH_BODY": body.decode(), "BENCH_AUTH": auth}
    argv = [wrk, "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "20s",
            "-s", str(WRK_SCRIPT), url]
    taskset = shutil.which("taskset")
    if cpus and taskset:
        argv = [taskset, "-c", ",".join(map(str, sorted(cpus))), *argv]
    done = subprocess.run(argv, capture_output=True, env=env, timeout=seconds + 60,
                          check=False)
    out = done.stdout.decode(errors="replace")
    for line in out.splitlines():
        if line.startswith("WRK_JSON "):
            result: dict[str, Any] = orjson.loads(line.removeprefix("WRK_JSON "))
            result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
            result["errors"] = sum(result[k] for k in ("connect", "read", "write", "status",
                                                       "timeout"))
            return result
    raise LoadError(f"wrk printed no summary (exit {done.returncode}): "
                    f"{out[-500:]} {done.stderr.decode(errors='replace')[-500:]}")


async def closed_loop_rps(session: aiohttp.ClientSession, url: str, auth: str, body: bytes,
                          connections: int, seconds: float) -> dict[str, Any]:
    """The fallback when wrk is missing: aiohttp workers back to back (a slower client)."""
    headers = headers_for(auth)
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            began = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    if resp.status != 200:
                        errors += 1
                        continue
            except (aiohttp.ClientError, TimeoutError):
                errors += 1
                continue
            latencies.append(time.perf_counter() - began)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(connections)))
    elapsed = time.perf_counter() - began
    latencies.sort()
    p99 = latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan")
    return {"requests": len(latencies), "rps": len(latencies) / elapsed, "errors": errors,
            "p99_us": p99 * 1e6, "p50_us": latencies[len(latencies) // 2] * 1e6
            if latencies else float("nan")}


@dataclass
class Parked:
    """Streaming requests held open on raw sockets."""

    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    failed: int = 0
    first_error: str | None = None

    def close(self) -> None:
        for writer in self.writers:
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self.writers.clear()


async def park_streams(host: str, port: int, path: str, auth: str, body: bytes, n: int,
                       parallel: int, time_limit_s: float, headers: bool = True) -> Parked:
    """Open `n` connections, send a streaming request on each, and keep each open once its
    200 and SSE headers have arrived (a queued stream gets them at once), or at once
    after sending when `headers` is false."""
    request = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: {auth}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
               ).encode() + body
    parked = Parked()
    gate = asyncio.Semaphore(parallel)
    deadline = time.monotonic() + time_limit_s

    async def one() -> None:
        async with gate:
            left = deadline - time.monotonic()
            if left <= 0:
                parked.failed += 1
                return
            writer: asyncio.StreamWriter | None = None
            try:
                async with asyncio.timeout(left):
                    reader, writer = await asyncio.open_connection(host, port, limit=4096)
                    writer.write(request)
                    await writer.drain()
                    head = await reader.readuntil(b"\r\n\r\n") if headers else b"HTTP/1.1 200"
                if not head.startswith(b"HTTP/1.1 200"):
                    raise LoadError(head.split(b"\r\n", 1)[0].decode(errors="replace"))
                parked.writers.append(writer)
            except (OSError, LoadError, TimeoutError, asyncio.IncompleteReadError) as exc:
                parked.failed += 1
                parked.first_error = parked.first_error or repr(exc)
                if writer is not None:
                    writer.transport.abort()

    await asyncio.gather(*(one() for _ in range(n)))
    return parked


def summarise(values: Sequence[float]) -> dict[str, float]:
    """p50 and p99 (linear interpolation) of `values`."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": float("nan"), "p99": float("nan"), "n": 0}

    def pct(q: float) -> float:
        pos = (len(ordered) - 1) * q / 100
        low = int(pos)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)

    return {"p50": pct(50), "p99": pct(99), "n": len(ordered)}
