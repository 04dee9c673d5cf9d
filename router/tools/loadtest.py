"""`slotgate loadtest`: a realistic mixed workload for N seconds, then the usage and cost report.

Poisson arrivals of natural prompts from many users, half streaming, at a multiple of the primary's
capacity; by default into an embedded gateway with a fresh ledger and a `fallback-ab` experiment
(the route's fallback off vs as configured), so one minute of load yields an A/B cost comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import enum
import importlib.resources
import math
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import orjson
import yaml

from policies.config import BackendConfig, Config, SimulatedSpec
from router.config import DEFAULT_CONFIG_PATH, ConfigError, config_from_dict, load_config
from router.tools.run import loop_factory

EXPERIMENT = "fallback-ab"
INTERRUPTED_DRAIN_S = 5.0  # after Ctrl-C, in-flight requests get this long to finish
_JSON = {"Content-Type": "application/json"}


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
                if stats.in_flight >= plan.max_in_flight:
                    stats.skipped += 1
                    continue
                stats.sent, stats.in_flight = stats.sent + 1, stats.in_flight + 1
                stats.streams += body["stream"]
                stats.users.add(body["user"])
                task = asyncio.create_task(_send(session, endpoint, body))
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


async def _send(session: aiohttp.ClientSession, endpoint: str, body: dict[str, Any]
                ) -> tuple[Outcome, str, float]:
    """One request, read to its end: (outcome, detail, latency in seconds)."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    try:
        async with session.post(endpoint, data=orjson.dumps(body), headers=_JSON) as resp:
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


def mean_output_tokens(spec: SimulatedSpec, max_tokens: int | None) -> float:
    """The simulated engine's mean answer length: uniform around its mean, cut at max_tokens."""
    low = spec.output_tokens * (1 - spec.output_tokens_spread)
    high = spec.output_tokens * (1 + spec.output_tokens_spread)
    cap = math.inf if max_tokens is None else float(max_tokens)
    if cap >= high:
        return (low + high) / 2
    if cap <= low:
        return cap
    return ((cap - low) * (low + cap) / 2 + (high - cap) * cap) / (high - low)


def capacity(backend: BackendConfig, max_tokens: int | None = None) -> float | None:
    """Requests per second a simulated backend completes with every slot busy (None: real URL).

    slots / (TTFT + mean output tokens / decode speed), the decode slowed by a full batch.
    """
    spec = backend.simulated
    if spec is None:
        return None
    seqs = min(backend.slots, spec.max_num_seqs)
    per_token = (1 + spec.batch_slowdown * (seqs - 1)) / spec.tokens_per_s \
        if spec.tokens_per_s else 0.0
    service_s = spec.ttft_s + mean_output_tokens(spec, max_tokens) * per_token
    return seqs / service_s if service_s > 0 else math.inf


def default_route(config: Config) -> str:
    """The first route that can fall back (what the A/B compares), else the first route."""
    with_fallbacks = (name for name, route in config.routes.items() if route.fallbacks)
    return next(with_fallbacks, next(iter(config.routes)))


def embedded_config(path: str | None, route: str, ledger: Path, ab: bool) -> Config:
    """The config file (validated already) with a fresh ledger and, with `ab`, the experiment."""
    text = (DEFAULT_CONFIG_PATH if path is None else Path(path)).read_text(encoding="utf-8")
    data: dict[str, Any] = dict(yaml.safe_load(text))
    kept = {k: v for k, v in (data.get("ledger") or {}).items() if k not in ("path", "url")}
    data["ledger"] = {**kept, "path": str(ledger)}
    if ab:
        arms = {"off": {"weight": 1, "fallback": {"when": "never"}}, "on": {"weight": 1}}
        data["experiments"] = {**(data.get("experiments") or {}),
                               EXPERIMENT: {"route": route, "arms": arms}}
    return config_from_dict(data)


class ProgressLine:
    """One status line on a terminal, redrawn in place; elsewhere a line every 10 s."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.tty, self.last = out, out.isatty(), -math.inf
        self.every_s = 0.25 if self.tty else 10.0

    def __call__(self, stats: Stats) -> None:
        now = time.monotonic()
        if now - self.last < self.every_s and stats.phase != "done":
            return
        self.last = now
        bad = stats[Outcome.ERROR] + stats[Outcome.CLIENT_ERROR] + stats[Outcome.TIMED_OUT]
        where = f"{stats.elapsed:4.0f}/{stats.seconds:.0f} s" if stats.phase == "running" \
            else stats.phase
        line = (f"{where}  sent {stats.sent}  in flight {stats.in_flight}  "
                f"ok {stats[Outcome.OK]}  429 {stats[Outcome.REJECTED]}  errors {bad}")
        self.out.write(f"\r{line}\x1b[K" if self.tty else line + "\n")
        if self.tty and stats.phase == "done":
            self.out.write("\n")
        self.out.flush()


_SUMMARY = ((Outcome.OK, "ok"), (Outcome.REJECTED, "rejected (429)"),
            (Outcome.TIMED_OUT, "timed out in the queue (503)"), (Outcome.ERROR, "other errors"),
            (Outcome.CLIENT_ERROR, "client errors"),
            (Outcome.CANCELLED, "still running when the drain ended"))


def summary(stats: Stats, plan: LoadPlan) -> str:
    """What happened, in one paragraph."""
    rate = stats.sent / stats.elapsed if stats.elapsed else 0.0
    counts = ", ".join(f"{stats[o]} {label}" for o, label in _SUMMARY
                       if stats[o] or o is not Outcome.CANCELLED)
    text = (f"Sent {stats.sent} requests to {plan.model} in {stats.elapsed:.0f} s ({rate:.2f}/s "
            f"against a target of {plan.rate:.2f}/s; {stats.streams} streaming, from "
            f"{len(stats.users)} users): {counts}.")
    if stats.skipped:
        text += f" {stats.skipped} arrivals skipped with {plan.max_in_flight} in flight."
    if stats.errors:
        text += " Not ok: " + ", ".join(f"{n} {k}" for k, n in stats.errors.most_common(5)) + "."
    if ordered := sorted(stats.latencies):
        p50, p95 = (ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.5, 0.95))
        text += (f" Latency of the ok requests: p50 {p50:.2f} s, p95 {p95:.2f} s, "
                 f"max {ordered[-1]:.2f} s.")
    return text + (" Interrupted with Ctrl-C." if stats.interrupted else "")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`slotgate loadtest`'s flags, on its sub-command or on `loadtest_main`'s parser."""
    p.description = "drive a mixed workload, then report usage and cost"
    p.add_argument("--config", help="YAML config (default: the embedded config.yaml)")
    p.add_argument("--url", help="drive a running gateway instead (needs --rate)")
    p.add_argument("--model", help="route to ask for (default: the first with fallbacks)")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--load", type=float, default=1.5, help="multiple of the primary's capacity")
    p.add_argument("--rate", type=float, help="requests per second (overrides --load)")
    p.add_argument("--users", type=int, default=500, help="distinct `user` values")
    p.add_argument("--stream-share", type=float, default=0.5)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--max-in-flight", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ledger", help="SQLite ledger file (default: a fresh one here)")
    p.add_argument("--ab", action=argparse.BooleanOptionalAction, default=True,
                   help=f"run the {EXPERIMENT} experiment (default: on; embedded gateway only)")
    report = p.add_mutually_exclusive_group()
    report.add_argument("--html", help="write the report as a self-contained HTML page")
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_run, parser=p)


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.seconds <= 0 or args.load <= 0 or (args.rate is not None and args.rate <= 0):
        p.error("--seconds, --load and --rate must be positive")
    if args.users < 1 or args.max_in_flight < 1 or (args.max_tokens or 1) < 1:
        p.error("--users, --max-in-flight and --max-tokens must be at least 1")
    if not 0 <= args.stream_share <= 1:
        p.error("--stream-share must be between 0 and 1")
    if args.url is not None and args.rate is None:
        p.error("--url needs --rate: the capacity of a running gateway is unknown")


def _rate(p: argparse.ArgumentParser, args: argparse.Namespace, config: Config, route: str
          ) -> float:
    if args.rate is not None:
        return float(args.rate)
    primary = config.routes[route].primary
    cap = capacity(config.backends[primary], args.max_tokens)
    if cap is None or math.isinf(cap):
        p.error(f"cannot work out the capacity of backend {primary!r}: give --rate")
    rate = float(cap * args.load)
    print(f"{primary}: capacity {cap:.2f} requests/s; {args.load:g}x load = {rate:.2f} "
          f"requests/s for {args.seconds:g} s", file=sys.stderr)
    return rate


async def _drive(url: str | None, config: Config | None, plan: LoadPlan, out: TextIO) -> Stats:
    """Start the embedded gateway unless `url`, run the load, close the gateway (Ctrl-C too)."""
    loop = asyncio.get_running_loop()
    stop, abort = asyncio.Event(), asyncio.Event()
    with contextlib.suppress(NotImplementedError, ValueError, RuntimeError):  # not main thread
        loop.add_signal_handler(signal.SIGINT, lambda: (abort if stop.is_set() else stop).set())
    running = None
    try:
        if url is None:
            from router.app import start_gateway

            assert config is not None
            running = await start_gateway(config, "127.0.0.1", 0)
            url = running.url
        return await run_load(url, plan, ProgressLine(out), stop, abort)
    finally:
        if running is not None:
            await running.close()  # flushes the ledger
        with contextlib.suppress(NotImplementedError, ValueError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)


def _report(args: argparse.Namespace, ledger: str | None) -> int:
    if ledger is None and args.config is None:
        print("no report: give --ledger (or --config) of the running gateway", file=sys.stderr)
        return 0
    from router.report.cli import report_main

    flags = {"--config": args.config, "--ledger": ledger, "--html": args.html}
    argv = [part for flag, value in flags.items() if value for part in (flag, value)]
    return report_main(argv + ["--json"] * args.json)


def loadtest_main(argv: list[str]) -> int:
    """`slotgate loadtest`: 0 done, 1 bad config or no gateway, 2 bad usage, 130 Ctrl-C."""
    p = argparse.ArgumentParser(prog="slotgate loadtest")
    add_arguments(p)
    return _run(p.parse_args(argv))


def _run(args: argparse.Namespace) -> int:
    p: argparse.ArgumentParser = args.parser
    _check(p, args)
    embedded, ledger = None, args.ledger
    try:
        config = load_config(args.config)
        route = args.model or default_route(config)
        if args.url is None and route not in config.routes:
            p.error(f"unknown route {route!r} (known: {', '.join(config.routes)})")
        rate = _rate(p, args, config, route)
        if args.url is None:
            ledger = ledger or f"slotgate-loadtest-{time.strftime('%Y%m%d-%H%M%S')}.sqlite3"
            embedded = embedded_config(args.config, route, Path(ledger), args.ab)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    plan = LoadPlan(route, rate, args.seconds, load_prompts(), args.users, args.stream_share,
                    args.max_tokens, args.seed, args.max_in_flight)
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            stats = runner.run(_drive(args.url, embedded, plan, sys.stderr))
    except OSError as exc:
        print(f"slotgate loadtest: {exc}", file=sys.stderr)
        return 1
    # With --json, stdout carries the report alone.
    print(summary(stats, plan), file=sys.stderr if args.json else sys.stdout, flush=True)
    if ledger is not None and args.url is None:
        print(f"ledger: {ledger}", file=sys.stderr)
    code = _report(args, ledger)
    return 130 if stats.interrupted else code
