"""What a queued streaming request holds in memory: RSS per queued request of slotgate
revisions side by side, and where this tree's Python allocations for one go, by line.

    .venv/bin/python bench/queue_memory.py [--base REV] [--queued 3000] [--rounds 2]
        [--top 25]

Each side is a gateway of the production-like config in front of slotgate's simulator
with every generation held: one request takes the backend's only slot, then `--queued`
streaming clients on raw sockets wait in its line (each kept open once its 200 and SSE
headers came). RSS per queued request is (VmRSS after - before) / queued. The sides
alternate for `--rounds` rounds, so that the box's state weighs on both alike.

Then this tree once more, with `tracemalloc` started in the gateway (8 frames) and a
snapshot taken before and after the clients queue (on SIGUSR1): the difference per queued
request by the line that allocated it, the largest `--top` lines. `tracemalloc` sees
Python's own allocations only, so its total is below the RSS figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import aiohttp
import orjson
from ab import KEY, checkout
from harness import HOST, free_port
from peer_configs import MOCK_MODEL, slotgate_yaml
from peers import Fleet, Server
from suite_load import park_streams

HERE = Path(__file__).resolve().parent.parent
BODY = orjson.dumps({"model": "held", "stream": True, "max_tokens": 16, "messages": [
    {"role": "user", "content": "Prove that there are infinitely many primes."}]})
SETTLE_S = 1.5  # for the gateway's last reads and writes before RSS is read


def _boot(tree: Path, snapshots: Path | None) -> str:
    """The gateway's command, with tracemalloc and a snapshot on SIGUSR1 when asked."""
    traced = "" if snapshots is None else f"""
import signal, tracemalloc
tracemalloc.start(8)
taken = [0]
def snapshot(*_):
    import os
    taken[0] += 1
    path = {str(snapshots)!r} + f"/{{taken[0]}}"
    tracemalloc.take_snapshot().dump(path + ".part")
    os.replace(path + ".part", path + ".bin")  # whole, or not there
signal.signal(signal.SIGUSR1, snapshot)
"""
    return (f"import sys; sys.path.insert(0, {str(tree)!r}){traced}\n"
            "from router.cli import main; sys.exit(main())")


async def _queue(fleet: Fleet, sim: Server, tree: Path, queued: int,
                 snapshots: Path | None = None) -> float:
    """KiB of RSS per queued request on a gateway of `tree` (snapshots taken if given)."""
    port = free_port()
    backend = (f"  held: {{url: \"{sim.url}/v1\", model: {MOCK_MODEL}, slots: 1, "
               f"queue_limit: {queued + 100}, queue_timeout_s: 600}}\n")
    config = fleet.dir / f"queue-{port}.yaml"
    config.write_text(slotgate_yaml(port, {"primary": sim.url, "small": sim.url},
                                    ledger=fleet.dir / f"queue-{port}.sqlite3", key=KEY,
                                    extra_backends=backend,
                                    extra_routes="  held: {primary: held, overflow: reject}\n",
                                    connections=queued + 1000))
    gw = fleet.start(f"gateway-{port}", [sys.executable, "-c", _boot(tree, snapshots),
                                         "serve", "--config", str(config)],
                     f"http://{HOST}:{port}", "/readyz", timeout_s=60.0)
    auth = f"Bearer {KEY}"
    holder = await park_streams(HOST, port, "/v1/chat/completions", auth, BODY, 1, 1, 30,
                                headers=False)
    parked = None
    try:
        await asyncio.sleep(SETTLE_S)
        before = gw.rss_mib()
        if snapshots is not None:
            os.kill(gw.pid, signal.SIGUSR1)
        parked = await park_streams(HOST, port, "/v1/chat/completions", auth, BODY, queued,
                                    256, 120)
        count = len(parked.writers)
        await asyncio.sleep(SETTLE_S)
        after = gw.rss_mib()
        if snapshots is not None:
            os.kill(gw.pid, signal.SIGUSR1)
            await asyncio.to_thread(_snapshots_written, snapshots, 2)
    finally:
        fleet.retire(gw)
        holder.close()
        if parked is not None:
            parked.close()
    if count == 0:
        raise RuntimeError(f"no client queued: {parked.first_error if parked else None}")
    return (after - before) * 1024 / count


def _snapshots_written(folder: Path, count: int) -> None:
    """Wait (in a thread) until the gateway has written `count` snapshots."""
    for _ in range(1200):  # a snapshot of a big heap takes seconds
        if len(list(folder.glob("*.bin"))) >= count:
            return
        time.sleep(0.1)
    raise RuntimeError("the gateway wrote no tracemalloc snapshot")


def by_line(snapshots: Path, queued: int, top: int) -> None:
    before = tracemalloc.Snapshot.load(str(snapshots / "1.bin"))
    after = tracemalloc.Snapshot.load(str(snapshots / "2.bin"))
    stats = after.compare_to(before, "lineno")
    total = sum(s.size_diff for s in stats)
    print(f"\nPython allocations per queued request: {total / queued / 1024:.2f} KiB "
          f"(tracemalloc, {queued:,} queued), the largest lines:")
    for stat in stats[:top]:
        where = stat.traceback[0]
        name = where.filename.rsplit("site-packages/", 1)[-1].replace(f"{HERE}/", "")
        print(f"  {stat.size_diff / queued:7.0f} B {stat.count_diff / queued:6.2f} objects"
              f"  {name}:{where.lineno}")


async def main_async(args: argparse.Namespace) -> None:
    with checkout(args.base) as base, Fleet() as fleet:
        sim = fleet.simulator()
        async with aiohttp.ClientSession() as http:
            async with http.post(sim.url + "/sim/hold", json={"after_tokens": 0}) as resp:
                resp.raise_for_status()
            sides = {"before": base, "after": HERE}
            found: dict[str, list[float]] = {name: [] for name in sides}
            for _ in range(args.rounds):
                for name, tree in sides.items():
                    found[name].append(await _queue(fleet, sim, tree, args.queued))
            print(f"RSS per queued streaming request ({args.queued:,} queued, KiB)")
            for name, readings in found.items():
                print(f"  {name:7} " + "  ".join(f"{kib:6.2f}" for kib in readings))
            with tempfile.TemporaryDirectory() as folder:
                await _queue(fleet, sim, HERE, args.queued, Path(folder))
                by_line(Path(folder), args.queued, args.top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1")
    parser.add_argument("--queued", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--top", type=int, default=25)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
