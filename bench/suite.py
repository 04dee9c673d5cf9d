"""The side-by-side benchmark suite (`make bench`): slotgate against its peers, same run.

    .venv/bin/python bench/suite.py [--quick] [--rounds N] [--apt] [--no-litellm]
                                    [--no-nginx] [--no-doc] [--json FILE] [--before REV]

Targets, all in front of one fast mock engine (bench/mock_backend.py, zero think time):
direct (no proxy), slotgate (`slotgate serve`, production-like config: auth, access log,
metrics, SQLite ledger, intent fallback on saturation; 1,024 slots), LiteLLM's proxy (one
worker, no database, telemetry off) and nginx (keep-alive upstream, proxy_buffering off);
with `--before REV`, also slotgate at REV (suite_before.py).
Rounds interleave the targets (the order rotates every round) phase by phase: latency at
concurrency 1, wrk at 64, streams at 16. Then, for slotgate alone: a py-spy profile under
the c=64 load, slot hand-off under saturation, memory per queued streaming request (10,000
queued), tracing's CPU per request (off, sample ratio 1 and 0.1, paired rounds), classifier
latency, and requests/s with Redis coordination for 1 and 2 processes.

Pinning (2+ CPUs): the server under test on CPU 0; the load generator (wrk or this
process) and the mock on CPU 1; for `direct` the mock is the server under test, on CPU 0.
The Redis phase runs unpinned (two gateway processes need both cores).

The results go to the terminal, to bench/.work/suite-*.json, and (unless --no-doc) to the
top section of docs/BENCHMARKS.md and docs/bench-peers.png. Loopback only; every loop is
bounded in count and time; every process is stopped on every exit path.

The phases are in suite_phases.py (side by side) and suite_alone.py (slotgate alone), the
output in suite_report.py (with suite_figures.py and suite_tables.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
import orjson

# Run as a script, so this directory is on sys.path and the siblings import by name.
from ab import REPO, checkout
from peer_tools import TOOLS_VENV, Tools, prepare
from peers import Fleet
from suite_alone import classifier, profile, redis, saturation, tracing
from suite_before import BEFORE, call_counts, start_before
from suite_load import LoadError
from suite_phases import FULL, LOAD_CPU, QUICK, SLOTGATE_KEY, WORK, Scale, Suite, Target
from suite_report import describe_machine, finish

Result = dict[str, Any]


async def run(args: argparse.Namespace, tools: Tools, scale: Scale) -> Result:
    pinned = len(os.sched_getaffinity(0)) >= 2 and not args.no_pin
    result: Result = {"scale": asdict(scale), "pinned": pinned}
    with contextlib.ExitStack() as stack:
        fleet = stack.enter_context(Fleet())
        before = stack.enter_context(checkout(args.before)) if args.before else None
        suite = Suite(fleet, tools, scale, pinned)
        if pinned:
            os.sched_setaffinity(0, {LOAD_CPU})  # servers start there; place() moves them
        else:
            suite.notes.append("not pinned: fewer than 2 usable CPUs (or --no-pin)")
        phase_s: dict[str, float] = {}

        def mark(name: str, began: float) -> None:
            phase_s[name] = time.perf_counter() - began
            print(f"  {name}: {phase_s[name]:.0f} s", file=sys.stderr, flush=True)

        began = time.perf_counter()
        suite.start_peers()
        if before is not None:
            assert suite.mock is not None
            suite.targets.insert(2, Target(BEFORE, start_before(fleet, before, suite.mock,
                                                               SLOTGATE_KEY)))
            result["before"] = args.before
        result["targets"] = [t.name for t in suite.targets]
        result["rss_start_mib"] = {t.name: t.server.rss_mib() for t in suite.targets}
        mark("start", began)
        connector = aiohttp.TCPConnector(limit=256, keepalive_timeout=60)
        async with aiohttp.ClientSession(connector=connector,
                                         timeout=aiohttp.ClientTimeout(total=120)) as session:
            began = time.perf_counter()
            result["rounds"] = await suite.rounds(session)
            result["peak_rss_mib"] = {t.name: t.server.hwm_mib() for t in suite.targets}
            mark("rounds", began)
            began = time.perf_counter()
            result["profile"] = profile(suite)
            mark("profile", began)
            for t in list(suite.targets):  # the peers are done: free their memory and CPU
                if t.name in ("litellm", "nginx", BEFORE):
                    fleet.retire(t.server)
            began = time.perf_counter()
            try:
                result["saturation"] = await saturation(suite, session)
            except (LoadError, aiohttp.ClientError, TimeoutError, OSError, RuntimeError) as exc:
                suite.notes.append(f"saturation phase failed: {exc!r:.400}")
            mark("saturation", began)
        began = time.perf_counter()
        try:
            result["tracing"] = tracing(suite)
        except (LoadError, RuntimeError, OSError) as exc:
            suite.notes.append(f"tracing phase failed: {exc!r:.400}")
        mark("tracing", began)
        began = time.perf_counter()
        suite.unpin()
        result["classifier"] = classifier(suite)
        mark("classifier", began)
        if before is not None:
            began = time.perf_counter()
            result["calls"] = call_counts({BEFORE: before, "slotgate": REPO})
            mark("calls", began)
        began = time.perf_counter()
        try:
            result["redis"] = await redis(suite)
        except (LoadError, RuntimeError, OSError) as exc:
            suite.notes.append(f"Redis phase failed: {exc!r:.400}")
        mark("redis", began)
        result["phase_seconds"] = phase_s
        result["notes"] = tools.notes + suite.notes
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short round: a smoke run")
    parser.add_argument("--rounds", type=int, help="rounds of the side-by-side phases")
    parser.add_argument("--apt", action="store_true",
                        help="apt-get install nginx and wrk when they are missing")
    parser.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out")
    parser.add_argument("--no-nginx", action="store_true", help="leave nginx out")
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    parser.add_argument("--no-doc", action="store_true",
                        help="do not rewrite docs/BENCHMARKS.md and docs/bench-peers.png")
    parser.add_argument("--before", metavar="REV",
                        help="also serve slotgate at REV (a git revision) in the rounds, "
                             "and show the hot path's targets before and after")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="measure nothing: redo the report, doc and chart from the "
                             "results of an earlier run (bench/.work/suite-*.json)")
    return parser.parse_args(argv)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through Fleet: every server is stopped


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # the queued clients and, inherited, the gateway need ~2 fds each
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.render is not None:
        earlier: Result = orjson.loads(args.render.read_bytes())
        tools = Tools(tools_python=str(TOOLS_VENV / "bin" / "python")
                      if (TOOLS_VENV / "bin" / "python").exists() else None)
        finish(earlier, tools, write_doc=not args.no_doc, started=None)
        return 0
    started = time.perf_counter()
    scale = QUICK if args.quick else FULL
    if args.rounds:
        scale = Scale(**{**asdict(scale), "rounds": args.rounds})
    _raise_fd_limit()
    print(f"slotgate side-by-side suite ({'quick' if args.quick else 'full'}, "
          f"{scale.rounds} rounds)", file=sys.stderr, flush=True)
    began = time.perf_counter()
    tools = prepare(apt=args.apt, litellm=not args.no_litellm, nginx=not args.no_nginx)
    setup_s = time.perf_counter() - began
    result: Result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "mode": "quick" if args.quick else "full",
        "machine": describe_machine(tools),
        "command": " ".join(["bench/suite.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    runner: Callable[..., Result] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    result.update(runner(run(args, tools, scale)))
    result["phase_seconds"]["setup (installs)"] = setup_s
    result["machine"]["loadavg_end"] = list(os.getloadavg())
    result["elapsed_s"] = time.perf_counter() - started
    WORK.mkdir(exist_ok=True)
    stamp = result["date"].replace(":", "").replace("-", "")[:15]
    out = WORK / f"suite-{stamp}.json"
    out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
    if args.json is not None:
        args.json.write_bytes(out.read_bytes())
    finish(result, tools, write_doc=not args.no_doc, started=started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
