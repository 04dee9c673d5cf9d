"""Tracing's own CPU per request, two revisions side by side: the hooks one request calls
(begin, one upstream attempt, end) and the export of its spans, nothing else of the
gateway, so that the small figures a noisy box hides in a whole gateway can be read.

    .venv/bin/python bench/tracing_spans.py [--base REV] [--after REV] [--requests 20000]
                                            [--rounds 3]

Each side runs in a process of its own with its tree first on sys.path: a `Tracer` as
`tracing.enabled` makes one, exporting OTLP/HTTP to a sink on loopback (a thread of that
process that reads each export and answers 200), its batch queue large enough to drop
nothing. `--requests` request records go through the hooks, at sample_ratio 1, 0.1 and 0;
the CPU of every thread of the process, the exporter's included, is read around each
(the last batch flushed inside). Rounds alternate the sides. A record's making (about
2 us, the gateway's cost, not tracing's) is measured alone and taken off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from ab import checkout

RATIOS = (1.0, 0.1, 0.0)
CHILD = r"""
import http.server, json, os, socketserver, sys, threading, time
os.environ["OTEL_BSP_MAX_QUEUE_SIZE"] = str(REQUESTS + 1024)
sys.path.insert(0, TREE)
from multidict import CIMultiDict
from policies.config import TracingConfig
try:
    from router.common.record import RequestRecord
except ImportError:  # a revision from before router/common/
    from router.record import RequestRecord  # type: ignore[no-redef]
from router.tracing.otel import Tracer


class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class Request:  # what Tracer.begin reads of an aiohttp request
    headers = CIMultiDict()


server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Sink)
server.daemon_threads = True
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_address[1]}"


def record(i):
    rec = RequestRecord(f"{i:032x}", "/v1/chat/completions", time.perf_counter(),
                        time.time(), f"{i:032x}", tenant="team-a", route="chat",
                        priority="standard", backend="big", replica="big", reason="primary")
    rec.status, rec.ttft_ms, rec.total_ms = 200, 12.3, 80.0
    rec.prompt_tokens, rec.completion_tokens = 24, 16
    return rec


out = {}
began = time.process_time()
for i in range(REQUESTS):
    record(i)
out["record"] = (time.process_time() - began) / REQUESTS * 1e6
for ratio in RATIOS:
    tracer = Tracer(TracingConfig(enabled=True, otlp_endpoint=url, sample_ratio=ratio))
    began = time.process_time()
    for i in range(REQUESTS):
        rec = record(i)
        trace = tracer.begin(Request, rec)
        trace.attempt("big", "big", "127.0.0.1", 8000, "big-model")
        trace.attempted(200, None)
        trace.end(rec, 64)
    tracer.close()  # the last batch exported, inside the reading
    out[str(ratio)] = (time.process_time() - began) / REQUESTS * 1e6 - out["record"]
print(json.dumps(out))
"""


def run(tree: Path, requests: int) -> dict[str, float]:
    code = (CHILD.replace("TREE", repr(str(tree))).replace("REQUESTS", str(requests))
            .replace("RATIOS", repr(RATIOS)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1")
    parser.add_argument("--after", default=None)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sides: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with checkout(args.base) as base_tree, checkout(args.after) as after_tree:
        for r in range(args.rounds):
            order = [("before", base_tree), ("after", after_tree)]
            for side, tree in order if r % 2 == 0 else order[::-1]:
                sides[side].append(run(tree, args.requests))
    print(f"tracing's CPU per request (us, every thread; median of {args.rounds} rounds, "
          f"{args.requests:,} requests each; a record's making taken off):")
    for ratio in RATIOS:
        key = str(ratio)
        before = statistics.median(r[key] for r in sides["before"])
        after = statistics.median(r[key] for r in sides["after"])
        print(f"  sample_ratio {ratio:<4}: before {before:6.1f}  after {after:6.1f}  "
              f"after / before x{after / before:.2f}")
    record = statistics.median(r["record"] for r in sides["after"])
    print(f"  (a request record's making: {record:.1f} us)")


if __name__ == "__main__":
    main()
