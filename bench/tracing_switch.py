"""What tracing costs, measured inside one gateway process: its tracing switched between
off, sample_ratio 1 and 0.1 from one block of load to the next.

    .venv/bin/python bench/tracing_switch.py [--rounds 12] [--seconds 3]

bench/tracing_overhead.py compares gateway processes; on a shared box two identical ones
differ by several percent (its `off-again` arm shows how much), more than the 3% this is
to resolve. Here one `slotgate serve` (the config of `make bench`, pinned to CPU 0 with
every thread) holds three tracers, made at startup as `tracing` would make one: none,
ratio 1 and ratio 0.1, each exporting OTLP/HTTP to the bench's sink. Between blocks the
bench writes the next mode to a file and sends SIGUSR1; the gateway flushes the tracer
it leaves, switches, and acknowledges. A block: a 1 s warm-up, a flush (the same mode
again), the process's CPU read (every thread), wrk at c=64 for `--seconds`, a flush,
the CPU read again: the block's traces, all exported, and nothing else. Each round runs
the three modes in an order that rotates; ratios to off are taken within a round, then
their median. "Off" still calls the switch once per request (it returns no trace): that
cost is counted in off's figure, against tracing's favour.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from ab import KEY, LOAD_CPU, SERVER_CPU, chat_body
from harness import HOST, REPO, free_port
from peer_configs import slotgate_yaml
from peers import Fleet, Server
from suite_load import LoadError, run_wrk
from suite_tables import tracing_table
from tracing_arms import CONCURRENCY, WARM_S, Result, Sink, summary

MODES = ("off", "ratio-1", "ratio-0.1")
# Run in the gateway before its CLI: `start_tracer` replaced by a switch of three tracers.
BOOT = r"""
import signal, sys
sys.path.insert(0, REPO)
import router.app
from router.tracing.otel import Tracer

class Switch:
    def __init__(self, config):
        self.tracers = [None, Tracer(config),
                        Tracer(config.model_copy(update={"sample_ratio": 0.1}))]
        self.at = 0
        signal.signal(signal.SIGUSR1, self.switch)

    def switch(self, *_):
        leaving = self.tracers[self.at]
        if leaving is not None:
            leaving.processor.force_flush()
        with open(MODE) as f:
            self.at = int(f.read())
        with open(MODE + ".ack", "w") as f:
            f.write(str(self.at))

    def begin(self, request, rec):
        tracer = self.tracers[self.at]
        return None if tracer is None else tracer.begin(request, rec)

    def close(self):
        for tracer in self.tracers[1:]:
            tracer.close()

router.app.start_tracer = lambda config: Switch(config)
from router.cli import main
sys.exit(main())
"""


def start(fleet: Fleet, mock: Server, sink: Sink, mode_file: Path) -> Server:
    port = free_port()
    config = fleet.dir / "tracing-switch.yaml"
    config.write_text(slotgate_yaml(port, {"primary": mock.url, "small": mock.url},
                                    ledger=fleet.dir / "tracing-switch.sqlite3", key=KEY)
                      + f"tracing: {{enabled: true, otlp_endpoint: '{sink.url}'}}\n")
    boot = BOOT.replace("REPO", repr(str(REPO))).replace("MODE", repr(str(mode_file)))
    server = fleet.start("tracing-switch", [sys.executable, "-c", boot, "serve", "--config",
                                            str(config), "--log-level", "warning"],
                         f"http://{HOST}:{port}", "/readyz", timeout_s=60.0)
    server.chat_url = server.url + "/v1/chat/completions"
    server.auth = f"Bearer {KEY}"
    return server


def switch(server: Server, mode_file: Path, mode: int) -> None:
    """The gateway's tracing to MODES[mode]; returns once it has acknowledged."""
    ack = Path(str(mode_file) + ".ack")
    ack.unlink(missing_ok=True)
    mode_file.write_text(str(mode))
    os.kill(server.popen.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while not (ack.exists() and ack.read_text() == str(mode)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway did not switch to {MODES[mode]}")
        time.sleep(0.01)  # (a bench polling a file, not a test)


def block(wrk: str, server: Server, mode_file: Path, mode: int, body: bytes, seconds: int,
          load: set[int] | None) -> Result:
    """One block of load in `mode`: requests/s and the gateway's CPU per request, its
    traces' export included (flushed before the CPU is read)."""
    switch(server, mode_file, mode)
    run_wrk(wrk, server.chat_url, body, server.auth, CONCURRENCY, WARM_S, load)
    switch(server, mode_file, mode)
    cpu0 = server.cpu_s()
    out = run_wrk(wrk, server.chat_url, body, server.auth, CONCURRENCY, seconds, load)
    switch(server, mode_file, mode)
    cpu = server.cpu_s() - cpu0
    if not out["requests"]:
        raise LoadError("no request completed")
    return {"rps": out["rps"], "errors": out["errors"], "requests": out["requests"],
            "cpu_us": cpu / out["requests"] * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=int, default=3)
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    pinned = len(os.sched_getaffinity(0)) >= 2
    load = {LOAD_CPU} if pinned else None
    if pinned:
        os.sched_setaffinity(0, {LOAD_CPU})
    body = chat_body()
    rounds: list[Result] = []
    with Sink() as sink, Fleet() as fleet:
        mock = fleet.mock()
        mode_file = fleet.dir / "tracing-mode"
        server = start(fleet, mock, sink, mode_file)
        if pinned:
            server.pin({SERVER_CPU})
        for r in range(args.rounds):
            order = [MODES[(r + i) % len(MODES)] for i in range(len(MODES))]
            row: Result = {"order": order}
            for mode in order:
                got = block(wrk, server, mode_file, MODES.index(mode), body, args.seconds,
                            load)
                row[mode] = got
                print(f"round {r + 1} {mode:9}: {got['rps']:7.0f} req/s "
                      f"{got['cpu_us']:5.0f} us/req", flush=True)
            rounds.append(row)
    print(f"\n{args.rounds} rounds of {args.seconds} s, one gateway process; medians (lowest "
          "to highest round); ratios to off within each round, then their median (range):\n")
    for line in tracing_table(summary(rounds)):
        print(line)
    print(f"sink: {sink.exports} exports, {sink.bytes / 1e6:.1f} MB of spans "
          f"({'pinned' if pinned else 'not pinned: fewer than 2 CPUs'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
