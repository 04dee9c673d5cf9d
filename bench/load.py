"""The load generator: aiohttp client loops, each bounded in count and in time.

Sequential latency in alternating blocks, closed-loop throughput at a fixed concurrency,
long-stream relay, and the per-request ids the slot hand-off measurement joins on.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

JSON_HEADERS = {"Content-Type": "application/json"}
_REQUEST_TIMEOUT_S = 30.0


class BenchError(Exception):
    """A request the benchmark relies on did not succeed."""


def chat_body(model: str, max_tokens: int, stream: bool) -> bytes:
    return orjson.dumps({
        "model": model, "max_tokens": max_tokens, "stream": stream,
        "messages": [{"role": "user", "content": "Say something short."}],
    })


def new_session(connections: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, keepalive_timeout=60),
        timeout=aiohttp.ClientTimeout(total=_REQUEST_TIMEOUT_S),
    )


@dataclass(frozen=True)
class Target:
    """Where to send chat completions: the engine directly or through the gateway."""

    name: str  # "direct" or "gateway"
    url: str  # the full chat completions URL
    model: str


async def request_once(session: aiohttp.ClientSession, url: str, body: bytes,
                       request_id: str | None = None,
                       extra_headers: Mapping[str, str] | None = None) -> bytes:
    """POST `body`, read the whole answer (time to last byte); raise BenchError if not 200."""
    headers = {**JSON_HEADERS, **(extra_headers or {})}
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    async with session.post(url, data=body, headers=headers) as resp:
        data = await resp.read()
        if resp.status != 200:
            raise BenchError(f"{url}: HTTP {resp.status}: {data[:200]!r}")
        return data


async def timed(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    """Seconds from sending to the last byte of the answer."""
    start = time.perf_counter()
    await request_once(session, url, body)
    return time.perf_counter() - start


async def interleaved_latency(
    session: aiohttp.ClientSession, targets: Sequence[Target], max_tokens: int, stream: bool,
    blocks: int, block_size: int, time_limit_s: float,
) -> dict[str, list[float]]:
    """Sequential requests (concurrency 1) in alternating blocks: A B, B A, A B, ...

    Alternating the order cancels drift and order effects; the first block of each
    target is a warm-up and is not recorded. Stops early (after a whole round) at the
    time limit, so both targets always have the same number of samples.
    """
    bodies = {t.name: chat_body(t.model, max_tokens, stream) for t in targets}
    samples: dict[str, list[float]] = {t.name: [] for t in targets}
    stop_at = time.perf_counter() + time_limit_s
    for block in range(blocks + 1):
        order = targets if block % 2 == 0 else list(reversed(targets))
        for target in order:
            for _ in range(block_size):
                elapsed = await timed(session, target.url, bodies[target.name])
                if block > 0:
                    samples[target.name].append(elapsed)
        if time.perf_counter() > stop_at:
            break
    return samples


@dataclass
class Throughput:
    requests: int = 0
    errors: int = 0
    elapsed_s: float = 0.0
    first_error: str | None = None

    @property
    def per_s(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s else 0.0


async def closed_loop(session: aiohttp.ClientSession, target: Target, concurrency: int,
                      duration_s: float, max_requests: int, max_tokens: int) -> Throughput:
    """`concurrency` workers send back-to-back until the duration or the count is used up."""
    body = chat_body(target.model, max_tokens, stream=False)
    result = Throughput()
    stop_at = time.perf_counter() + duration_s

    async def worker() -> None:
        while time.perf_counter() < stop_at and result.requests + result.errors < max_requests:
            try:
                await request_once(session, target.url, body)
                result.requests += 1
            except (BenchError, aiohttp.ClientError, TimeoutError) as exc:
                result.errors += 1
                result.first_error = result.first_error or repr(exc)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.elapsed_s = time.perf_counter() - start
    return result


@dataclass
class StreamRelay:
    streams: int = 0
    events: int = 0
    bytes: int = 0
    elapsed_s: float = 0.0
    durations_s: list[float] = field(default_factory=list)

    @property
    def events_per_s(self) -> float:
        return self.events / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def mib_per_s(self) -> float:
        return self.bytes / self.elapsed_s / 2**20 if self.elapsed_s else 0.0


async def stream_once(session: aiohttp.ClientSession, url: str, body: bytes) -> tuple[int, int]:
    """One stream read to its end: (SSE events, bytes)."""
    async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
        if resp.status != 200:
            raise BenchError(f"{url}: HTTP {resp.status}")
        data = await resp.read()
    if not data.endswith(b"data: [DONE]\n\n"):
        raise BenchError(f"{url}: stream ended without [DONE]")
    return data.count(b"\n\n"), len(data)


async def stream_relay(session: aiohttp.ClientSession, target: Target, concurrency: int,
                       tokens: int, streams: int, time_limit_s: float) -> StreamRelay:
    """`concurrency` clients read long streams back to back: events and bytes per second."""
    body = chat_body(target.model, tokens, stream=True)
    result = StreamRelay()
    stop_at = time.perf_counter() + time_limit_s
    started = 0

    async def worker() -> None:
        nonlocal started
        while started < streams and time.perf_counter() < stop_at:
            started += 1
            t0 = time.perf_counter()
            events, size = await stream_once(session, target.url, body)
            result.durations_s.append(time.perf_counter() - t0)
            result.streams += 1
            result.events += events
            result.bytes += size

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.elapsed_s = time.perf_counter() - start
    return result


async def tagged_requests(session: aiohttp.ClientSession, target: Target, clients: int,
                          count: int, time_limit_s: float, prefix: str,
                          extra_headers: Mapping[str, str] | None = None) -> int:
    """`clients` workers send non-streaming requests with X-Request-Id `prefix`-N.

    Returns how many succeeded; the engine's records are joined on these ids.
    """
    body = chat_body(target.model, 16, stream=False)
    stop_at = time.perf_counter() + time_limit_s
    sent = 0
    done = 0

    async def worker() -> None:
        nonlocal sent, done
        while sent < count and time.perf_counter() < stop_at:
            sent += 1
            await request_once(session, target.url, body, f"{prefix}-{sent}", extra_headers)
            done += 1

    await asyncio.gather(*(worker() for _ in range(clients)))
    return done


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def handoff_gaps(records: Sequence[Mapping[str, Any]], prefix: str, skip: int) -> list[float]:
    """Engine idle gaps (next start - previous end, in s) between the records with `prefix`.

    The records come from GET /sim/requests; `skip` drops warm-up records at the start.
    """
    mine = sorted(
        (float(r["started_at"]), float(r["ended_at"]))
        for r in records
        if str(r["request_id"]).startswith(prefix) and r["ended_at"] is not None
    )[skip:]
    return [nxt[0] - prev[1] for prev, nxt in itertools.pairwise(mine)]
