"""Instructions per request, counted by valgrind (callgrind): slotgate revisions beside the
bare aiohttp pass-through and slotgate's own floor, in one run.

    .venv/bin/python bench/instructions.py [--base REV] [--after REV] [--requests 1000]

CPU time on this shared box moves by 15-20% from one round to the next, so a step of a few
percent on the request path cannot be seen in it. An instruction count can: it is the same
from run to run within about 1%, whatever else the machine does. Each side runs under
callgrind (about 100 times slower) in front of one mock engine, with the production-like
config of `make bench` for slotgate; 300 requests warm it (the ledger's INSERTs prepared,
the classifier loaded), the counters are zeroed, `--requests` requests are sent by 8
clients, and the counts of every thread of the process are read.

Under callgrind the request rate is a hundred times lower, so work done per second (the
stall clock's tick, the ledger's flush timer) weighs a hundred times more per request.
That share is measured apart: the same process idle for as long as the requests took,
and taken off. What is left is user-space work per request; the kernel's (the socket
calls) is not counted, and is about the same for every side.

The sides: `aiohttp` (bench/passthrough.py, ClientSession), `floor` (the same server
relaying through slotgate's own upstream client, none of slotgate's work), then the
revisions. Prints thousands of instructions per request and the ratios to aiohttp's.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from ab import KEY, chat_body, checkout
from harness import HOST, free_port
from peer_configs import slotgate_yaml
from peers import BENCH, Fleet, Server

WARM = 300
CLIENTS = 8


async def send(url: str, count: int, auth: str) -> None:
    body, headers = chat_body(), {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = auth
    left = count

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            async with session.post(url, data=body, headers=headers) as resp:
                data = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {data[:300]!r}")

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(CLIENTS)))


def _counted(out: Path, pid: int) -> int:
    """The instructions in callgrind's dumps of `pid` since the last zeroing (then removed)."""
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    total = 0
    for dump in glob.glob(f"{out}.{pid}.*"):  # one per dump (threads are merged)
        with open(dump) as lines:
            total += next(int(line.split()[1]) for line in lines
                          if line.startswith(("summary:", "totals:")))
        os.unlink(dump)
    return total


def measure(fleet: Fleet, name: str, argv: list[str], probe: str, auth: str, port: int,
            requests: int) -> float:
    """Thousands of instructions per request of the server `argv` starts."""
    out = fleet.dir / f"{name}.callgrind"
    server: Server = fleet.start(name, ["valgrind", "--tool=callgrind", "--dump-instr=no",
                                        f"--callgrind-out-file={out}.%p", *argv],
                                 f"http://{HOST}:{port}", probe, timeout_s=600)
    url, pid = server.url + "/v1/chat/completions", server.pid
    asyncio.run(send(url, WARM, auth))
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    _counted(out, pid)  # (the zeroing's own dump)
    began = time.monotonic()
    asyncio.run(send(url, requests, auth))
    took = time.monotonic() - began
    loaded = _counted(out, pid)
    time.sleep(took)  # idle as long: the work a second costs, whatever the load
    idle = _counted(out, pid)
    fleet.retire(server)
    return (loaded - idle) / requests / 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1")
    parser.add_argument("--after", default=None, help="a revision (default: this tree)")
    parser.add_argument("--requests", type=int, default=1000)
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    found: dict[str, float] = {}
    with checkout(args.base) as before, checkout(args.after) as after, Fleet() as fleet:
        mock = fleet.mock()
        sides: dict[str, tuple[list[str], str, str]] = {}
        for name, client in (("aiohttp", "aiohttp"), ("floor", "slotgate")):
            sides[name] = ([sys.executable, str(BENCH / "passthrough.py"), "--upstream",
                            mock.url, "--host", HOST, "--client", client], "/health", "")
        for name, tree in (("before", before), ("after", after)):
            boot = (f"import sys; sys.path.insert(0, {str(tree)!r}); "
                    "from router.cli import main; sys.exit(main())")
            sides[name] = ([sys.executable, "-c", boot, "serve", "--log-level", "INFO",
                            "--config"], "/readyz", f"Bearer {KEY}")
        for name, (argv, probe, auth) in sides.items():
            port = free_port()
            if probe == "/readyz":
                config = fleet.dir / f"{name}.yaml"
                config.write_text(slotgate_yaml(port, {"primary": mock.url, "small": mock.url},
                                                ledger=fleet.dir / f"{name}.sqlite3", key=KEY))
                argv = [*argv, str(config)]
            else:
                argv = [*argv, "--port", str(port)]
            found[name] = measure(fleet, name, argv, probe, auth, port, args.requests)
            print(f"{name:8} {found[name]:7.0f} k instructions per request", flush=True)
    base = found["aiohttp"]
    print(f"\nper request, against the aiohttp pass-through ({args.requests} requests each)")
    for name, count in found.items():
        print(f"  {name:8} x{count / base:.3f}")
    print(f"  after / before x{found['after'] / found['before']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
