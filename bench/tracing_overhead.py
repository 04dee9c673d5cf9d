"""What tracing costs: one slotgate per arm (tracing off, on at sample_ratio 1, on at
0.1, and on at 1 with the SDK's OTLP/HTTP exporter in place of slotgate's), each exporting
OTLP/HTTP to a local sink, same run, interleaved rounds.

    .venv/bin/python bench/tracing_overhead.py [--rounds 4] [--seconds 8]

The config of `make bench` (auth, access log, SQLite ledger, a steering route) in front of
the mock engine. Per round, in rotating order, for each arm: wrk at c=64 (requests/s,
gateway CPU per request, the BatchSpanProcessor's exporting thread included). The sink
(aiohttp, in this process, on the load CPU) answers every export at once and counts the
spans' bytes. Prints medians, the rounds' spread and the ratios against `off`.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import threading

from ab import KEY, LOAD_CPU, SERVER_CPU, chat_body, pin
from aiohttp import web
from harness import HOST, REPO, free_port
from peer_configs import MOCK_MODEL, slotgate_yaml
from peers import Fleet, Server
from suite_load import run_wrk

# name: (sample ratio, the SDK's own OTLP/HTTP exporter instead of slotgate's)
ARMS = {"off": (None, False), "ratio-1": (1.0, False), "ratio-0.1": (0.1, False),
        "ratio-1-sdk": (1.0, True)}
# The "-sdk" arm's boot: the SDK's exporter (and encoder), as before router.tracing.wire.
SDK_EXPORTER = ("import router.tracing.otel as otel; "
                "from opentelemetry.exporter.otlp.proto.http.trace_exporter import "
                "OTLPSpanExporter; "
                "otel.exporter = lambda c: OTLPSpanExporter(endpoint=c.otlp_endpoint + "
                "'/v1/traces'); ")


class Sink:
    """An OTLP/HTTP endpoint that takes every export (200, nothing parsed)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.exports = self.bytes = 0
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        async def traces(request: web.Request) -> web.Response:
            self.bytes += len(await request.read())
            self.exports += 1
            return web.Response(content_type="application/x-protobuf")

        async def serve() -> None:
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_post("/v1/traces", traces)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, HOST, self.port).start()
            ready.set()
            await asyncio.Event().wait()

        asyncio.run(serve())


def start_arm(fleet: Fleet, name: str, mock: Server, ratio: float | None, sdk: bool,
              sink: Sink) -> Server:
    port = free_port()
    config = fleet.dir / f"{name}.yaml"
    tracing = ("" if ratio is None else
               f"tracing: {{enabled: true, otlp_endpoint: 'http://{HOST}:{sink.port}', "
               f"sample_ratio: {ratio}}}\n")
    config.write_text(slotgate_yaml(port, {"primary": mock.url, "small": mock.url},
                                    ledger=fleet.dir / f"{name}.sqlite3", key=KEY) + tracing)
    boot = (f"import sys; sys.path.insert(0, {str(REPO)!r}); "
            + (SDK_EXPORTER if sdk else "") + "from router.cli import main; sys.exit(main())")
    server = fleet.start(name, [sys.executable, "-c", boot, "serve", "--config", str(config),
                                "--log-level", "warning"], f"http://{HOST}:{port}", "/readyz")
    pin(server.popen.pid, SERVER_CPU)
    return server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=8)
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    pin(0, LOAD_CPU)  # this process (the sink) beside the load, not the gateways
    sink = Sink()
    body = chat_body()
    rows: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    with Fleet() as fleet:
        mock = fleet.mock()
        pin(mock.popen.pid, LOAD_CPU)
        servers = {arm: start_arm(fleet, arm, mock, ratio, sdk, sink)
                   for arm, (ratio, sdk) in ARMS.items()}
        for r in range(args.rounds):
            arms = list(ARMS)
            order = arms[r % len(arms):] + arms[:r % len(arms)]
            for arm in order:
                server = servers[arm]
                url = server.url + "/v1/chat/completions"
                run_wrk(wrk, url, body, f"Bearer {KEY}", 64, 1, {LOAD_CPU})  # warm
                cpu0 = server.cpu_s()
                out = run_wrk(wrk, url, body, f"Bearer {KEY}", 64, args.seconds, {LOAD_CPU})
                row = {"rps": out["rps"], "errors": out["errors"],
                       "cpu_us": (server.cpu_s() - cpu0) / out["requests"] * 1e6}
                rows[arm].append(row)
                print(f"round {r + 1} {arm:11}: {row['rps']:7.0f} req/s {row['cpu_us']:5.0f} "
                      f"us/req, errors {row['errors']:.0f}", flush=True)
    for key in ("rps", "cpu_us"):
        base = statistics.median(r[key] for r in rows["off"])
        for arm, got in rows.items():
            mid = statistics.median(r[key] for r in got)
            low, high = min(r[key] for r in got), max(r[key] for r in got)
            print(f"{key:6} {arm:11} {mid:8.1f}  x{mid / base:.3f} of off  "
                  f"(rounds {low:.1f}-{high:.1f})")
    print(f"sink: {sink.exports} exports, {sink.bytes / 1e6:.1f} MB of spans")
    print(f"(model {MOCK_MODEL}; targets: CPU per request at most x1.15 of off at ratio 1, "
          "x1.03 at 0.1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
