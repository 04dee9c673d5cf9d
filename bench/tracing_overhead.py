"""What tracing costs: one slotgate per arm (tracing off, on at sample_ratio 1, on at
0.1, and on at 1 with the SDK's OTLP/HTTP exporter in place of slotgate's), each exporting
OTLP/HTTP to a local sink, same run, interleaved rounds.

    .venv/bin/python bench/tracing_overhead.py [--rounds 8] [--seconds 4]
                                               [--log-level warning] [--base REV]
                                               [--arms off,ratio-1,...]

The config of `make bench` (auth, access log, SQLite ledger, a steering route) in front of
the mock engine; at the default `--log-level warning` the access lines (INFO) are not
written (the suite's tracing phase runs at INFO). Per round, in rotating order, for each
arm: a 1 s warm-up, then wrk at c=64 (requests/s, gateway CPU per request, the
BatchSpanProcessor's exporting thread included). The arm under test runs on CPU 0, the
other arms, wrk, the mock and the sink (aiohttp, in this process; answers every export at
once) on CPU 1. Prints each arm's medians and range over the rounds, and its ratios to
`off` taken within each round, then their median and range (bench/tracing_arms.py). With
`--base REV`, ratio 1 and 0.1 are also served from REV (a temporary git worktree): a
change's before and after in one run. The suite (`make bench`) runs a shorter version
without the SDK arm.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from ab import KEY, LOAD_CPU, SERVER_CPU, chat_body, checkout
from harness import REPO
from peer_configs import MOCK_MODEL
from peers import Fleet, Server
from suite_tables import tracing_table
from tracing_arms import ARMS, BASE_ARMS, Sink, ratio_of_medians, run_rounds, start_arm, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--log-level", default="warning", help="the gateways' log level")
    parser.add_argument("--arms", default=",".join(a for a in ARMS if a not in BASE_ARMS),
                        help="which arms, comma-separated (off is always one; --base adds "
                             "the base revision's)")
    parser.add_argument("--base", metavar="REV",
                        help="also ratio 1 and 0.1 as served by REV (a git worktree): the "
                             "before/after of a change, in the same run")
    args = parser.parse_args()
    chosen = set(args.arms.split(","))
    if not chosen <= set(ARMS):
        parser.error(f"--arms: one of {', '.join(ARMS)}")
    wrk = shutil.which("wrk")
    if wrk is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    pinned = len(os.sched_getaffinity(0)) >= 2
    if pinned:  # this process (the sink's thread starts here) beside the load
        os.sched_setaffinity(0, {LOAD_CPU})
    with (Sink() as sink, checkout(args.base) as base,
          Fleet() as fleet):  # the gateways stop (and flush) first
        mock = fleet.mock()
        servers = {arm: start_arm(fleet, arm, mock.url, sink, KEY, log_level=args.log_level,
                                  repo=base if arm in BASE_ARMS else REPO)
                   for arm in ARMS if arm == "off" or arm in chosen
                   or (args.base and arm in BASE_ARMS)}

        def place(under_test: Server) -> None:
            if pinned:
                for server in fleet.servers:
                    server.pin({LOAD_CPU})
                under_test.pin({SERVER_CPU})

        rounds = run_rounds(wrk, servers, chat_body(), args.rounds, args.seconds, place,
                            {LOAD_CPU} if pinned else None, lambda line: print(line, flush=True))
    print(f"\n{args.rounds} rounds of {args.seconds} s; medians (lowest to highest round); "
          "the ratios to off taken within each round, then their median (range):\n")
    for line in tracing_table(summary(rounds)):
        print(line)
    unpaired = ", ".join(f"{arm} x{r:.3f}" for arm in servers if arm != "off"
                         if (r := ratio_of_medians(rounds, arm, "cpu_us")) is not None)
    print(f"\nCPU per request, ratio of the medians (unpaired): {unpaired}")
    print(f"sink: {sink.exports} exports, {sink.bytes / 1e6:.1f} MB of spans")
    print(f"(model {MOCK_MODEL}; targets: CPU per request at most x1.15 of off at ratio 1, "
          f"x1.03 at 0.1; {'pinned' if pinned else 'not pinned: fewer than 2 CPUs'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
