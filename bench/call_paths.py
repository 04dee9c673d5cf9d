"""Python function calls per request made by the gateway alone, on the three paths that
matter: a free slot, a stream, and a request that waits in line and is then served.

Counted, not timed: a noisy box cannot hide a change. The gateway runs on this process's
main thread; its engines (slotgate's simulator, a token a millisecond) and the client
(aiohttp) run on a second thread with an event loop of their own. cProfile follows the
thread that enables it, so what it counts is the gateway's own work: its server, its
handlers, its upstream client, the callbacks its event loop runs (uvloop's, as `slotgate
serve` runs it when installed: the loop itself is C), and nothing of the client's or the
engines'.

Config: the embedded default (config.yaml: auth off, the access log, metrics, the SQLite
ledger, a steering route), each simulated backend made a `url:` backend on an engine of
the same spec, fast (`FAST`), plus `llama-70b-line`, a copy of llama-70b with one slot and
no fallback, where the second of two requests sent at once waits (the engine holds the
first until the gateway reports the second in line).

    free      POST /v1/chat/completions on llama-70b, a slot free, not streamed
    streamed  the same, streamed (usage asked for)
    queued    on llama-70b-line, two at once: the pair's calls less one free request's

    .venv/bin/python bench/call_paths.py [--tree DIR] [--requests 300] [--json]

`--tree`: the source tree to measure (default: this one); `bench/request_calls.py` runs
this file against two revisions, and tests/test_call_budget.py holds each path to a
budget.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import cProfile
import json
import os
import pstats
import queue
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, NamedTuple

PATHS = ("free", "streamed", "queued")
DEVNULL = open(os.devnull, "w")
WARM_UP = 30
HERE = Path(__file__).resolve().parent.parent
# No time to the first token; a token a millisecond, so that a stream's chunks reach the
# gateway one read each (a chunk's relay takes well under that), as from a real engine:
# the count is then the most a stream of 16 tokens costs, not a lucky coalesced read.
FAST = {"ttft_s": 0, "tokens_per_s": 1000, "output_tokens": 16}


class Load:
    """The second thread: the engines and the client, and the hand-offs with the gateway."""

    def __init__(self, requests: int) -> None:
        self.requests = requests
        self.engines: concurrent.futures.Future[dict[str, str]] = concurrent.futures.Future()
        self.gateway: concurrent.futures.Future[str] = concurrent.futures.Future()
        self.to_gateway: queue.Queue[tuple[str, str]] = queue.Queue()
        self.go: queue.Queue[str] = queue.Queue()
        self.queued: concurrent.futures.Future[None] | None = None
        self.sims: dict[str, Any] = {}
        self.failure: BaseException | None = None

    def run(self, specs: dict[str, dict[str, Any]]) -> None:
        try:
            asyncio.run(self._main(specs))
        except BaseException as exc:  # reported to the gateway's thread, which waits on it
            self.failure = exc
            self.to_gateway.put(("failed", repr(exc)))

    async def _main(self, specs: dict[str, dict[str, Any]]) -> None:
        import aiohttp

        from policies.config import SimulatedSpec
        from router.upstream.simulated.app import start_simulator

        sims = {name: await start_simulator(SimulatedSpec(**spec), "m")
                for name, spec in specs.items()}
        self.sims = {name: sim.engine for name, sim in sims.items()}
        self.engines.set_result({name: sim.url for name, sim in sims.items()})
        url = await asyncio.wrap_future(self.gateway)
        try:
            async with aiohttp.ClientSession() as http:
                for path in PATHS:
                    for _ in range(WARM_UP):
                        await self._one(http, url, path)
                    self.to_gateway.put(("ready", path))
                    await asyncio.get_running_loop().run_in_executor(None, self.go.get)
                    for _ in range(self.requests):
                        await self._one(http, url, path)
                    self.to_gateway.put(("done", path))
        finally:
            for sim in sims.values():
                await sim.close()

    async def _one(self, http: Any, url: str, path: str) -> None:
        if path != "queued":
            await _send(http, url, "llama-70b", path == "streamed")
            return
        engine = self.sims["llama-70b-line"]
        engine.hold()  # the first holds the slot until the second is in line
        self.queued = concurrent.futures.Future()
        first = asyncio.ensure_future(_send(http, url, "llama-70b-line", False))
        await engine.wait_until(lambda sim: sim.held == 1)
        second = asyncio.ensure_future(_send(http, url, "llama-70b-line", False))
        await asyncio.wrap_future(self.queued)
        engine.release()
        await asyncio.gather(first, second)


async def _send(http: Any, url: str, model: str, stream: bool) -> None:
    body: dict[str, Any] = {"model": model, "max_tokens": 16, "stream": stream,
                            "messages": [{"role": "user", "content": "Say hello."}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{model}: {resp.status} {await resp.text()}")
        await resp.read()


def gateway_config(tree: Path, folder: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The embedded config with its simulated backends turned into `url:` backends (filled
    in once the engines listen), and the engines' specs by backend name."""
    import yaml

    config = yaml.safe_load((tree / "config.yaml").read_text())
    line = dict(config["backends"]["llama-70b"], slots=1, queue_limit=4)
    config["backends"]["llama-70b-line"] = line
    config["routes"]["llama-70b-line"] = {"primary": "llama-70b-line", "overflow": "reject"}
    specs = {}
    for name, backend in config["backends"].items():
        spec = backend.pop("simulated")
        specs[name] = {**spec, **FAST, "max_num_seqs": backend["slots"]}
    config["ledger"] = {**config.get("ledger", {}), "path": f"{folder}/ledger.sqlite3"}
    config.setdefault("server", {}).update(port=0)
    return config, specs


class Counts(NamedTuple):
    calls: dict[str, float]  # per request, by path
    where: dict[str, dict[str, float]]  # per request, by path and function


async def gateway_side(load: Load, config: dict[str, Any]) -> Counts:
    from router.app import start_gateway
    from router.config import config_from_dict
    from router.telemetry import logs

    logs.setup("info").stream = DEVNULL  # the access log written, as by `slotgate serve`
    urls = await asyncio.wrap_future(load.engines)
    for name, url in urls.items():
        config["backends"][name]["url"] = f"{url}/v1"
    gw = await start_gateway(config_from_dict(config), "127.0.0.1", 0)
    pool = gw.gateway.backends["llama-70b-line"].pool

    def watch(_: object) -> None:  # (its few calls per change are counted in `queued`)
        signal = load.queued
        if signal is not None and not signal.done() and pool.queued:
            signal.set_result(None)

    unwatch = pool.watch(watch)
    load.gateway.set_result(gw.url)
    counts: dict[str, float] = {}
    where: dict[str, dict[str, float]] = {}
    loop = asyncio.get_running_loop()
    try:
        for _ in PATHS:
            what, path = await loop.run_in_executor(None, load.to_gateway.get)
            if what == "failed":
                raise RuntimeError(f"the load side failed: {path}")
            profile = cProfile.Profile()
            profile.enable()
            load.go.put(path)
            what, path = await loop.run_in_executor(None, load.to_gateway.get)
            profile.disable()
            if what == "failed":
                raise RuntimeError(f"the load side failed: {path}")
            counts[path], where[path] = per_request(pstats.Stats(profile), load.requests)
    finally:
        unwatch()
        await gw.close()
    counts["queued"] -= counts["free"]
    where["queued"] = {name: n - where["free"].get(name, 0.0)
                       for name, n in where["queued"].items()}
    return Counts(counts, where)


def per_request(stats: pstats.Stats, requests: int) -> tuple[float, dict[str, float]]:
    """Calls per request in all, and by function (`path:name`, the tree's prefix off)."""
    where: dict[str, float] = {}
    for (path, _, name), (_, calls, *_) in stats.stats.items():  # type: ignore[attr-defined]
        short = path.rsplit("site-packages/", 1)[-1]
        for prefix in map(str, sys.path[:1]):
            short = short.removeprefix(prefix.rstrip("/") + "/")
        where[f"{short}:{name}"] = where.get(f"{short}:{name}", 0.0) + calls / requests
    return stats.total_calls / requests, where  # type: ignore[attr-defined]


def loop_factory() -> Any:
    """The gateway's event loop as `slotgate serve` runs it: uvloop's when installed."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def measure(tree: Path, requests: int) -> Counts:
    sys.path.insert(0, str(tree))
    with tempfile.TemporaryDirectory() as folder:
        config, specs = gateway_config(tree, folder)
        load = Load(requests)
        side = threading.Thread(target=load.run, args=(specs,), name="load", daemon=True)
        side.start()
        try:
            with asyncio.Runner(loop_factory=loop_factory()) as runner:
                return runner.run(gateway_side(load, config))
        finally:
            side.join(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=HERE)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--json", action="store_true",
                        help="one JSON line: calls per request by path, and by function")
    args = parser.parse_args()
    counts = measure(args.tree.resolve(), args.requests)
    if args.json:
        print(json.dumps(counts._asdict()))
        return
    for path in PATHS:
        print(f"{path:9} {counts.calls[path]:7,.0f} calls per request")


if __name__ == "__main__":
    main()
