"""Two revisions of slotgate side by side, same run: the before/after of a change.

    .venv/bin/python bench/ab.py [--base REV] [--after REV] [--rounds 4] [--seconds 8]
                                 [--idle 1000] [--streams]

`--base` (default HEAD~1) is checked out into a temporary git worktree and served by this
interpreter with that tree first on sys.path; the other side is this working tree, or
`--after` checked out the same way. Both
get the production-like config of `make bench` (auth, access log, SQLite ledger, intent
fallback) in front of one mock engine. Per round, in alternating order: wrk at c=64
(requests/s, server CPU per request); with `--streams`, also 16 clients reading
200-chunk streams back to back for `--seconds` (chunks/s, server CPU per chunk; the
client runs in this process, on the load CPU). Then, for each side, the memory of N idle
connections: opened and left silent, and kept alive after one request. Prints medians and
ratios (after / before). Loopback only; every loop is bounded; every process is stopped.

The gateway runs on CPU 0, wrk and the mock on CPU 1 (when the machine has two).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness import HOST, free_port
from peer_configs import slotgate_yaml
from peers import Fleet, Server
from suite_load import chat_body as stream_body
from suite_load import run_wrk, streams

REPO = Path(__file__).resolve().parent.parent
KEY = "sk-bench-ab-0123456789"
SERVER_CPU, LOAD_CPU = 0, 1
ADDRESSES = 20  # idle connections come from 127.0.0.2.. so no per-address cap is the limit


def chat_body(tokens: int = 16) -> bytes:
    import orjson

    return orjson.dumps({"model": "mock", "max_tokens": tokens,
                         "messages": [{"role": "user", "content": "Say hello."}]})


@contextlib.contextmanager
def checkout(rev: str | None) -> Iterator[Path]:
    """`rev` in a temporary worktree (None: this working tree)."""
    if rev is None:
        yield REPO
        return
    with tempfile.TemporaryDirectory(prefix="slotgate-ab-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q",
                        str(tree), rev], check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(tree)], check=False)


def start_side(fleet: Fleet, name: str, tree: Path, mock: Server) -> Server:
    port = free_port()
    config = fleet.dir / f"{name}.yaml"
    config.write_text(slotgate_yaml(port, {"primary": mock.url, "small": mock.url},
                                    ledger=fleet.dir / f"{name}.sqlite3", key=KEY))
    boot = (f"import sys; sys.path.insert(0, {str(tree)!r}); import router; "
            f"assert router.__file__.startswith({str(tree)!r}), router.__file__; "
            "from router.cli import main; sys.exit(main())")
    server = fleet.start(name, [sys.executable, "-c", boot, "serve", "--config", str(config),
                                "--log-level", "warning"],
                         f"http://{HOST}:{port}", "/readyz")
    server.chat_url = server.url + "/v1/chat/completions"
    pin(server.popen.pid, SERVER_CPU)
    return server


def pin(pid: int, cpu: int) -> None:
    if (os.cpu_count() or 1) >= 2:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(pid, {cpu})


def throughput(wrk: str, server: Server, mock: Server, seconds: int) -> dict[str, float]:
    body = chat_body()
    run_wrk(wrk, server.chat_url, body, f"Bearer {KEY}", 64, 1, {LOAD_CPU})  # warm
    cpu0, mock0, began = server.cpu_s(), mock.cpu_s(), time.perf_counter()
    out = run_wrk(wrk, server.chat_url, body, f"Bearer {KEY}", 64, seconds, {LOAD_CPU})
    elapsed = time.perf_counter() - began
    cpu, mock_cpu = server.cpu_s() - cpu0, mock.cpu_s() - mock0
    return {"rps": out["rps"], "cpu_us": cpu / out["requests"] * 1e6, "errors": out["errors"],
            "busy": cpu / elapsed, "mock_us": mock_cpu / out["requests"] * 1e6}


def stream_rate(server: Server, seconds: int) -> dict[str, float]:
    """16 clients reading 200-chunk streams: chunks/s and server CPU per chunk."""
    import asyncio

    import aiohttp

    async def run() -> Any:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            body = stream_body("mock", 200, True)
            await streams(session, server.chat_url, f"Bearer {KEY}", body, 16, 0.5)  # warm
            cpu0 = server.cpu_s()
            out = await streams(session, server.chat_url, f"Bearer {KEY}", body, 16, seconds)
            return out, server.cpu_s() - cpu0

    pin(os.getpid(), LOAD_CPU)
    got, cpu = asyncio.run(run())
    if got.errors:
        raise RuntimeError(f"stream errors: {got.first_error}")
    return {"chunks_s": got.events_per_s, "cpu_us_chunk": cpu / got.events * 1e6}


def idle_memory(server: Server, count: int, after_request: bool) -> float:
    """MiB the server's RSS grew by while `count` idle connections are open."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    before = server.rss_mib()
    socks: list[socket.socket] = []
    try:
        for i in range(count):
            sock = socket.socket()
            sock.bind((f"127.0.0.{2 + i % ADDRESSES}", 0))
            sock.connect((host, int(port)))
            socks.append(sock)
        if after_request:
            for sock in socks:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
            for sock in socks:
                sock.settimeout(10)
                got = b""
                while b"\r\n\r\n" not in got or not got.endswith(b"}"):
                    part = sock.recv(4096)
                    if not part:
                        raise RuntimeError("the server closed an idle-test connection")
                    got += part
        else:
            time.sleep(0.5)  # let the server accept them all (a bench, not a test)
        return server.rss_mib() - before
    finally:
        for sock in socks:
            sock.close()


def median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1")
    parser.add_argument("--after", default=None, help="a revision (default: this tree)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--streams", action="store_true", help="also the stream phase")
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    idle: dict[str, dict[str, float]] = {}
    with checkout(args.base) as tree, checkout(args.after) as after, Fleet() as fleet:
        mock = fleet.mock()
        pin(mock.popen.pid, LOAD_CPU)
        sides = {"before": start_side(fleet, "before", tree, mock),
                 "after": start_side(fleet, "after", after, mock)}
        for r in range(args.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for name in order:
                row = throughput(wrk, sides[name], mock, args.seconds)
                results[name].append(row)
                print(f"round {r + 1} {name:6}: {row['rps']:8.0f} req/s  "
                      f"{row['cpu_us']:6.0f} us/req  server busy {row['busy']:.2f}  "
                      f"mock {row['mock_us']:4.0f} us/req  errors {row['errors']:.0f}",
                      flush=True)
                if args.streams:
                    row.update(stream_rate(sides[name], args.seconds))
                    print(f"round {r + 1} {name:6}: {row['chunks_s']:8.0f} chunks/s "
                          f"{row['cpu_us_chunk']:6.2f} us/chunk", flush=True)
        for name, server in sides.items():
            idle[name] = {"silent": idle_memory(server, args.idle, after_request=False),
                          "kept_alive": idle_memory(server, args.idle, after_request=True)}
    out: dict[str, Any] = {}
    for key in ("rps", "cpu_us", "busy", "mock_us",
                *(("chunks_s", "cpu_us_chunk") if args.streams else ())):
        b, a = median(results["before"], key), median(results["after"], key)
        spread = {n: (min(r[key] for r in rows), max(r[key] for r in rows))
                  for n, rows in results.items()}
        out[key] = (b, a)
        print(f"{key:7} before {b:8.2f} after {a:8.2f}  ratio x{a / b:.3f}  "
              f"(rounds: before {spread['before'][0]:.2f}-{spread['before'][1]:.2f}, "
              f"after {spread['after'][0]:.2f}-{spread['after'][1]:.2f})")
    for kind in ("silent", "kept_alive"):
        b, a = idle["before"][kind], idle["after"][kind]
        print(f"{args.idle} idle connections ({kind}): before +{b:.1f} MiB, after +{a:.1f} MiB"
              f" ({b * 1024 / args.idle:.1f} / {a * 1024 / args.idle:.1f} KiB each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
