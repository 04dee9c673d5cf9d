"""`slotgate loadtest`: a realistic mixed workload for N seconds, then the usage and cost report.

Poisson arrivals of natural prompts from many users, half streaming, at a multiple of the primary's
capacity; by default into an embedded gateway with a fresh ledger and a `fallback-ab` experiment
(the route's fallback off vs as configured), so one minute of load yields an A/B cost comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml

from policies.config import BackendConfig, Config, SimulatedSpec
from router.common.config_error import ConfigError
from router.config import DEFAULT_CONFIG_PATH, config_from_dict, load_config
from router.tools.run import loop_factory
from router.tools.workload import LoadPlan, Outcome, Stats, load_prompts, run_load

if TYPE_CHECKING:
    from router.quality.shadows import ShadowRunner

EXPERIMENT = "fallback-ab"


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
        stats = await run_load(url, plan, ProgressLine(out), stop, abort)
        if running is not None and running.gateway.shadows is not None:
            await _judged(running.gateway.shadows, out)
        return stats
    finally:
        if running is not None:
            await running.close()  # flushes the ledger
        with contextlib.suppress(NotImplementedError, ValueError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)


async def _judged(shadows: ShadowRunner, out: TextIO, within_s: float = 120.0) -> None:
    """Let the shadow comparisons of the run's moved requests finish (the slots are idle
    now), for the report's quality table."""
    if shadows.settled.is_set():
        return
    print(f"judging {len(shadows.pending) + len(shadows.busy)} shadow comparisons "
          f"(at most {within_s:g} s)", file=out, flush=True)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within_s):
            await shadows.settled.wait()


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
