"""The load test's workload and its client: Poisson arrivals of natural prompts from many users,
sent to a gateway and read to their end, with every outcome counted (`run_load`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import importlib.resources
import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

INTERRUPTED_DRAIN_S = 5.0  # after Ctrl-C, in-flight requests get this long to finish
_JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class Caller:
    """A share of the requests sent as one kind of caller: with this API key (none: no
    Authorization header) and asking for this class (`x-slotgate-priority`; none: the
    key's own)."""

    share: float
    key: str | None = None
    priority: str | None = None

    def headers(self) -> dict[str, str]:
        headers = dict(_JSON)
        if self.key is not None:
            headers["Authorization"] = f"Bearer {self.key}"
        if self.priority is not None:
            headers["x-slotgate-priority"] = self.priority
        return headers


@dataclass(frozen=True)
class LoadPlan:
    model: str  # the route to ask for
    rate: float  # requests per second, on average
    seconds: float
    prompts: Sequence[str]
    users: int = 500  # distinct `user` values, each request picks one uniformly
    stream_share: float = 0.5
    max_tokens: int | None = None
    seed: int = 0
    max_in_flight: int = 2000  # arrivals beyond this are skipped, not sent
    drain_s: float = 120.0  # how long in-flight requests may take after the last arrival
    tick_s: float = 0.25  # how often `progress` is called
    callers: tuple[Caller, ...] = ()  # who sends them (none: one anonymous caller)


class Outcome(enum.StrEnum):
    OK = "ok"
    REJECTED = "rejected"  # 429: every slot and queue full
    TIMED_OUT = "timed_out"  # 503, or a stream told so in-band: gave up waiting in the queue
    ERROR = "error"  # any other status, an in-band error, a stream without [DONE]
    CLIENT_ERROR = "client_error"  # no answer: connection refused or reset, timeout
    CANCELLED = "cancelled"  # still running when the drain ended


_BY_STATUS = {429: Outcome.REJECTED, 503: Outcome.TIMED_OUT}
_BY_CODE = {"queue_full": Outcome.REJECTED, "queue_timeout": Outcome.TIMED_OUT}  # in-band errors


@dataclass
class Stats:
    seconds: float  # planned
    elapsed: float = 0.0  # of the arrivals, not counting the drain
    phase: str = "running"  # running | draining | done
    sent: int = 0
    streams: int = 0
    in_flight: int = 0
    skipped: int = 0  # arrivals not sent: max_in_flight reached
    interrupted: bool = False
    outcomes: Counter[Outcome] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # detail of the non-ok outcomes
    latencies: list[float] = field(default_factory=list)  # seconds, of the ok requests
    users: set[str] = field(default_factory=set)

    def __getitem__(self, outcome: Outcome) -> int:
        return self.outcomes[outcome]

    def finished(self, task: asyncio.Task[tuple[Outcome, str, float]]) -> None:
        if task.cancelled():
            self.record(Outcome.CANCELLED, "", 0.0)
        elif (exc := task.exception()) is not None:
            self.record(Outcome.CLIENT_ERROR, type(exc).__name__, 0.0)
        else:
            self.record(*task.result())

    def record(self, outcome: Outcome, detail: str, latency: float) -> None:
        self.in_flight -= 1
        self.outcomes[outcome] += 1
        if outcome is Outcome.OK:
            self.latencies.append(latency)
        elif detail:
            self.errors[detail] += 1


def arrival_times(rate: float, rng: random.Random) -> Iterator[float]:
    """Poisson arrivals: seconds since the start, the gaps exponential with mean 1/rate."""
    at = 0.0
    while True:
        at += rng.expovariate(rate)
        yield at


def load_prompts() -> list[str]:
    """The natural prompts (English and Chinese, simple and complex) the classifier is tested on."""
    path = importlib.resources.files("classifier") / "data" / "heldout_natural.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    return [str(orjson.loads(line)["text"]) for line in lines if line.strip()]


def request_body(plan: LoadPlan, rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": plan.model,
        "messages": [{"role": "user", "content": rng.choice(plan.prompts)}],
        "user": f"loadtest-user-{rng.randrange(plan.users):04d}",
        "stream": rng.random() < plan.stream_share,
    }
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    if plan.max_tokens is not None:
        body["max_tokens"] = plan.max_tokens
    return body


async def run_load(url: str, plan: LoadPlan, progress: Callable[[Stats], None] | None = None,
                   stop: asyncio.Event | None = None, abort: asyncio.Event | None = None) -> Stats:
    """Send `plan` to the gateway at `url`, then wait for the answers (at most `drain_s`).

    `stop` ends the arrivals early and shortens the drain; `abort` ends the drain at once.
    """
    loop = asyncio.get_running_loop()
    stop, abort = stop or asyncio.Event(), abort or asyncio.Event()
    stats = Stats(plan.seconds)
    endpoint = url.rstrip("/").removesuffix("/v1") + "/v1/chat/completions"
    content = random.Random(f"requests-{plan.seed}")  # apart from the arrivals' own stream
    tasks: set[asyncio.Task[tuple[Outcome, str, float]]] = set()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0),
                                     skip_auto_headers=("User-Agent",)) as session:
        start = loop.time()
        ticker = asyncio.create_task(_tick(progress, stats, start, plan.tick_s))
        try:
            for offset in arrival_times(plan.rate, random.Random(plan.seed)):
                if offset >= plan.seconds or not await _wait_until(start + offset, stop):
                    break
                body = request_body(plan, content)
                headers = _caller(plan.callers, content)
                if stats.in_flight >= plan.max_in_flight:
                    stats.skipped += 1
                    continue
                stats.sent, stats.in_flight = stats.sent + 1, stats.in_flight + 1
                stats.streams += body["stream"]
                stats.users.add(body["user"])
                task = asyncio.create_task(_send(session, endpoint, body, headers))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                task.add_done_callback(stats.finished)
            await _wait_until(start + plan.seconds, stop)
            stats.elapsed, stats.phase = loop.time() - start, "draining"
            stats.interrupted = stop.is_set()
            await _drain(tasks, INTERRUPTED_DRAIN_S if stats.interrupted else plan.drain_s, abort)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            ticker.cancel()
            await asyncio.gather(ticker, return_exceptions=True)
    stats.phase = "done"
    if progress is not None:
        progress(stats)
    return stats


async def _wait_until(when: float, stop: asyncio.Event) -> bool:
    """Wait until the loop clock reads `when`; False if `stop` was set first."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout_at(when):
            await stop.wait()
    return not stop.is_set()


async def _tick(progress: Callable[[Stats], None] | None, stats: Stats, start: float,
                every_s: float) -> None:
    loop = asyncio.get_running_loop()
    while progress is not None:
        if stats.phase == "running":
            stats.elapsed = min(stats.seconds, loop.time() - start)
        progress(stats)
        await asyncio.sleep(every_s)  # a refresh rate, not a synchronisation


async def _drain(tasks: set[asyncio.Task[Any]], timeout_s: float, abort: asyncio.Event) -> None:
    """Let the requests in flight finish, for at most `timeout_s` or until `abort`."""
    if not tasks:
        return
    everything = asyncio.gather(*tasks, return_exceptions=True)
    aborted = asyncio.ensure_future(abort.wait())
    either: set[asyncio.Future[Any]] = {everything, aborted}
    try:
        await asyncio.wait(either, timeout=timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        aborted.cancel()
        everything.cancel()  # cancels the requests still running
        await asyncio.gather(everything, aborted, return_exceptions=True)


def _caller(callers: Sequence[Caller], rng: random.Random) -> dict[str, str]:
    """The headers of the next request's caller, drawn by share."""
    if not callers:
        return _JSON
    point = rng.random() * sum(c.share for c in callers)
    for caller in callers:
        point -= caller.share
        if point < 0:
            return caller.headers()
    return callers[-1].headers()


async def _send(session: aiohttp.ClientSession, endpoint: str, body: dict[str, Any],
                headers: dict[str, str] = _JSON) -> tuple[Outcome, str, float]:
    """One request, read to its end: (outcome, detail, latency in seconds)."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        async with session.post(endpoint, data=orjson.dumps(body), headers=headers) as resp:
            if resp.status != 200:
                await resp.read()
                outcome = _BY_STATUS.get(resp.status, Outcome.ERROR)
                return outcome, str(resp.status), loop.time() - began
            if not body["stream"]:
                await resp.read()
                return Outcome.OK, "", loop.time() - began
            outcome, detail = await _read_stream(resp.content)
            return outcome, detail, loop.time() - began
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return Outcome.CLIENT_ERROR, type(exc).__name__, loop.time() - began


async def _read_stream(content: aiohttp.StreamReader) -> tuple[Outcome, str]:
    """Read an SSE answer until EOF; ok once `[DONE]` came without an error event."""
    done, error = False, ""
    async for raw in content:
        if not raw.startswith(b"data:"):
            continue  # blank lines and the gateway's queue comments
        data = raw[5:].strip()
        if data == b"[DONE]":
            done = True
        elif data.startswith(b'{"error"') and not error:
            found = orjson.loads(data)["error"]
            error = str(found.get("code") or found.get("type") or "error")
    if error:
        return _BY_CODE.get(error, Outcome.ERROR), error
    return (Outcome.OK, "") if done else (Outcome.ERROR, "stream ended without [DONE]")
