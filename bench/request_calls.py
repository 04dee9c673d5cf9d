"""Python function calls per request, two revisions side by side: a request path's cost
counted, not timed, so that a noisy box cannot hide a change.

    .venv/bin/python bench/request_calls.py [--base REV] [--after REV] [--requests 800]

Each side runs in a process of its own with its tree first on sys.path: a gateway on the
config of `make bench` in spirit (auth, access log, SQLite ledger, a steering route), its
simulated engines (no delay) and an aiohttp client, all in that one process under
cProfile, sending `--requests` chat completions one after another (half streamed) after
a warm-up. The engine's and the client's calls are the same on both sides: the
difference is the gateway's. Prints calls per request for each side and the ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from ab import checkout

CHILD = r"""
import asyncio, cProfile, hashlib, json, pstats, sys, tempfile
sys.path.insert(0, TREE)
import aiohttp
from router.app import start_gateway
from router.config import config_from_dict

KEY = "sk-bench-calls-0123456789"


def config(folder):
    sim = {"max_num_seqs": 8, "ttft_s": 0, "tokens_per_s": 0, "output_tokens": 16}
    return {
        "backends": {
            "big": {"simulated": sim, "model": "big", "slots": 8, "queue_limit": 8},
            "small": {"simulated": sim, "model": "small", "slots": 8, "queue_limit": 8},
        },
        "routes": {"chat": {"primary": "big", "fallbacks": ["small"],
                            "overflow": "fallback", "fallback": {"when": "saturated"}}},
        "auth": {"enabled": True, "keys": [
            {"id": "bench", "tenant": "bench",
             "sha256": hashlib.sha256(KEY.encode()).hexdigest()}]},
        "ledger": {"path": folder + "/ledger.sqlite3"},
    }


async def send(http, url, i):
    body = {"model": "chat", "max_tokens": 16, "stream": i % 2 == 1,
            "messages": [{"role": "user", "content": "Say hello."}]}
    async with http.post(url, json=body, headers={"Authorization": "Bearer " + KEY}) as r:
        assert r.status == 200, r.status
        await r.read()


async def main():
    with tempfile.TemporaryDirectory() as folder:
        gw = await start_gateway(config_from_dict(config(folder)), "127.0.0.1", 0)
        url = gw.url + "/v1/chat/completions"
        try:
            async with aiohttp.ClientSession() as http:
                for i in range(50):
                    await send(http, url, i)
                profile = cProfile.Profile()
                profile.enable()
                for i in range(REQUESTS):
                    await send(http, url, i)
                profile.disable()
        finally:
            await gw.close()
    stats = pstats.Stats(profile)
    where = {}
    for (path, line, name), (_, calls, *_) in stats.stats.items():
        short = path.split(TREE.rstrip("/") + "/", 1)[-1].rsplit("site-packages/", 1)[-1]
        where[f"{short}:{name}"] = where.get(f"{short}:{name}", 0) + calls / REQUESTS
    print(json.dumps({"calls": stats.total_calls / REQUESTS, "where": where}))


asyncio.run(main())
"""


def count(tree: Path, requests: int) -> dict[str, object]:
    code = CHILD.replace("TREE", repr(str(tree))).replace("REQUESTS", str(requests))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD~1")
    parser.add_argument("--after", default=None)
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--top", type=int, default=15, help="functions whose counts moved most")
    args = parser.parse_args()
    with checkout(args.base) as base_tree, checkout(args.after) as after_tree:
        base, later = count(base_tree, args.requests), count(after_tree, args.requests)
    before, after = float(base["calls"]), float(later["calls"])  # type: ignore[arg-type]
    was: dict[str, float] = base["where"]  # type: ignore[assignment]
    now: dict[str, float] = later["where"]  # type: ignore[assignment]
    moved = sorted(((now.get(k, 0.0) - was.get(k, 0.0), k) for k in {*was, *now}),
                   key=lambda item: -abs(item[0]))
    for delta, name in moved[:args.top]:
        if abs(delta) >= 0.5:
            print(f"  {delta:+6.1f}  {name}")
    print(f"function calls per request ({args.requests} requests, half streamed): "
          f"before {before:,.0f}, after {after:,.0f}, after / before x{after / before:.3f} "
          f"({after - before:+,.0f})")


if __name__ == "__main__":
    main()
