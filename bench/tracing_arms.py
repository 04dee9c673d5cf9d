"""What tracing's cost is measured with, shared by bench/tracing_overhead.py (standalone,
longer, with the SDK-exporter arm) and the suite's tracing phase (bench/suite_alone.py).

- `Sink`: an OTLP/HTTP endpoint in the bench's own process that takes every export;
- `start_arm`: one `slotgate serve` of the `make bench` config, tracing off or on at a
  sample ratio, exporting to the sink (optionally through the SDK's exporter);
- `run_rounds`: per round, in rotating order, each arm warmed up and then measured with
  wrk (requests/s, the gateway's CPU per request from /proc: every thread, the exporter's
  included);
- `summary`: the medians of the raw figures, and each arm's ratios to `off` taken within
  each round (paired: same minute, same machine state) and then the median and range,
  which a noisy shared box disturbs less than a ratio of medians.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web
from harness import HOST, REPO, free_port
from peer_configs import slotgate_yaml
from peers import Fleet, Server
from suite_figures import spread
from suite_load import LoadError, run_wrk

Result = dict[str, Any]
# name: (sample ratio, the SDK's own OTLP/HTTP exporter instead of slotgate's)
ARMS: dict[str, tuple[float | None, bool]] = {
    "off": (None, False), "off-again": (None, False), "ratio-1": (1.0, False),
    "ratio-0.1": (0.1, False), "ratio-1-sdk": (1.0, True), "ratio-1-base": (1.0, False),
    "ratio-0.1-base": (0.1, False)}
SUITE_ARMS = ("off", "ratio-1", "ratio-0.1")
BASE_ARMS = ("ratio-1-base", "ratio-0.1-base")  # served from another revision (--base)
# The issue's targets: CPU per request at most this multiple of `off`'s.
TARGETS = {"ratio-1": 1.15, "ratio-0.1": 1.03}
LABELS = {"off": "off", "off-again": "off, again (the method's noise)", "ratio-1": "ratio 1",
          "ratio-0.1": "ratio 0.1",
          "ratio-1-sdk": "ratio 1, SDK encoder", "ratio-1-base": "ratio 1, base revision",
          "ratio-0.1-base": "ratio 0.1, base revision"}
# The "-sdk" arm's boot: the SDK's OTLP/HTTP exporter (and encoder) in place of
# router.tracing.wire's, fed the SDK's ReadableSpans (as the gRPC exporter is).
SDK_EXPORTER = ("import router.tracing.otel as otel; "
                "from opentelemetry.exporter.otlp.proto.http.trace_exporter import "
                "OTLPSpanExporter; "
                "otel.http_exporter = lambda c, attributes, scope: otel.SdkSpans("
                "OTLPSpanExporter(endpoint=c.otlp_endpoint + '/v1/traces'), "
                "otel.Resource(attributes)); ")
CONCURRENCY = 64
WARM_S = 1


class Sink:
    """An OTLP/HTTP endpoint that takes every export (200, nothing parsed), on a thread
    of this process; stopped by close() or on leaving its `with`."""

    def __init__(self) -> None:
        self.port = free_port()
        self.exports = self.bytes = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(ready),),
                                        name="otlp-sink", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the OTLP sink did not start")

    async def _serve(self, ready: threading.Event) -> None:
        async def traces(request: web.Request) -> web.Response:
            self.bytes += len(await request.read())
            self.exports += 1
            return web.Response(content_type="application/x-protobuf")

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", traces)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, HOST, self.port).start()
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            ready.set()
            await self._stop.wait()
        finally:
            await runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def close(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def start_arm(fleet: Fleet, name: str, mock_url: str, sink: Sink, key: str, *,
              log_level: str = "warning", repo: Path = REPO) -> Server:
    """`slotgate serve` of arm `name` (a key of ARMS), from the code in `repo`, unpinned:
    the caller places it."""
    ratio, sdk = ARMS[name]
    port = free_port()
    config = fleet.dir / f"tracing-{name}.yaml"
    tracing = ("" if ratio is None else
               f"tracing: {{enabled: true, otlp_endpoint: '{sink.url}', "
               f"sample_ratio: {ratio}}}\n")
    config.write_text(slotgate_yaml(port, {"primary": mock_url, "small": mock_url},
                                    ledger=fleet.dir / f"tracing-{name}.sqlite3", key=key)
                      + tracing)
    boot = (f"import sys; sys.path.insert(0, {str(repo)!r}); "
            + (SDK_EXPORTER if sdk else "") + "from router.cli import main; sys.exit(main())")
    server = fleet.start(f"tracing-{name}", [sys.executable, "-c", boot, "serve", "--config",
                                             str(config), "--log-level", log_level],
                         f"http://{HOST}:{port}", "/readyz", timeout_s=60.0)
    server.chat_url = server.url + "/v1/chat/completions"
    server.auth = f"Bearer {key}"
    return server


def measure(wrk: str, server: Server, body: bytes, seconds: int,
            load: set[int] | None) -> Result:
    """A warm-up, then wrk at c=64: requests/s and the server's CPU per request."""
    run_wrk(wrk, server.chat_url, body, server.auth, CONCURRENCY, WARM_S, load)
    cpu0 = server.cpu_s()
    out = run_wrk(wrk, server.chat_url, body, server.auth, CONCURRENCY, seconds, load)
    cpu = server.cpu_s() - cpu0
    if not out["requests"]:
        raise LoadError(f"{server.name}: no request completed")
    return {"rps": out["rps"], "errors": out["errors"], "requests": out["requests"],
            "cpu_us": cpu / out["requests"] * 1e6}


def run_rounds(wrk: str, servers: Mapping[str, Server], body: bytes, rounds: int,
               seconds: int, place: Callable[[Server], None], load: set[int] | None,
               say: Callable[[str], None]) -> list[Result]:
    """Every arm once per round, the order rotating; `place` puts the arm under test on
    its CPU before it is measured. One dict per round: its order and each arm's figures
    (or {"error": ...})."""
    arms = list(servers)
    out: list[Result] = []
    for r in range(rounds):
        order = arms[r % len(arms):] + arms[:r % len(arms)]
        row: Result = {"order": order}
        for arm in order:
            place(servers[arm])
            try:
                got = measure(wrk, servers[arm], body, seconds, load)
            except (LoadError, OSError) as exc:
                row[arm] = {"error": repr(exc)[:300]}
                say(f"round {r + 1} {arm:11}: failed: {exc!r:.200}")
                continue
            row[arm] = got
            say(f"round {r + 1} {arm:11}: {got['rps']:7.0f} req/s {got['cpu_us']:5.0f} us/req, "
                f"errors {got['errors']:.0f}")
        out.append(row)
    return out


def _values(rounds: Sequence[Result], arm: str, key: str) -> list[float | None]:
    out: list[float | None] = []
    for row in rounds:
        cell = row.get(arm)
        out.append(None if not cell or "error" in cell else cell[key])
    return out


def _paired(rounds: Sequence[Result], arm: str, key: str) -> list[float]:
    """`arm`'s figure over `off`'s in the same round, for every round that has both."""
    return [a / b for a, b in zip(_values(rounds, arm, key), _values(rounds, "off", key),
                                  strict=True) if a is not None and b]


def summary(rounds: Sequence[Result]) -> dict[str, Result]:
    """Per arm (in ARMS' order): requests/s and CPU per request (median and range over the
    rounds), the per-round ratios to off (median and range), errors, and the target."""
    present = [arm for arm in ARMS if any(arm in row for row in rounds)]
    out: dict[str, Result] = {}
    for arm in present:
        cpu_ratio = spread(_paired(rounds, arm, "cpu_us"))
        target = TARGETS.get(arm)
        out[arm] = {
            "label": LABELS[arm],
            "rps": spread([v for v in _values(rounds, arm, "rps") if v is not None]),
            "cpu_us": spread([v for v in _values(rounds, arm, "cpu_us") if v is not None]),
            "rps_ratio": spread(_paired(rounds, arm, "rps")),
            "cpu_ratio": cpu_ratio,
            "cpu_best_ratio": _best(rounds, arm, "cpu_us"),
            "errors": sum(v or 0 for v in _values(rounds, arm, "errors")),
            "target": target,
            "met": None if target is None or cpu_ratio is None
            else cpu_ratio["median"] <= target}
    return out


def _best(rounds: Sequence[Result], arm: str, key: str) -> float | None:
    """`arm`'s lowest figure over off's: each arm's least disturbed round (a shared box
    only ever adds time), a second reading beside the paired median."""
    a = [v for v in _values(rounds, arm, key) if v is not None]
    b = [v for v in _values(rounds, "off", key) if v is not None]
    return min(a) / min(b) if a and b else None


def ratio_of_medians(rounds: Sequence[Result], arm: str, key: str) -> float | None:
    """The unpaired figure (median over median), for comparison with earlier runs."""
    a = [v for v in _values(rounds, arm, key) if v is not None]
    b = [v for v in _values(rounds, "off", key) if v is not None]
    return statistics.median(a) / statistics.median(b) if a and b else None
