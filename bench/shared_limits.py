"""A token budget under three gateway processes with 50 concurrent clients each: how far
past its limit the key is served, with each process keeping its own book (`mode: local`)
and with the book held in Redis (`mode: redis`), in one run.

Every client sends requests back to back (`max_tokens` 64) until it is refused; the
tokens of the answered requests are summed. Overshoot is that sum less the budget, also
given in requests (the largest answered request's tokens). Target (Redis): at most one.

    .venv/bin/python bench/shared_limits.py [--limit 30000] [--redis redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import uuid
from typing import Any

import aiohttp
import orjson
from harness import Processes, Server

KEY = "sk-bench-budget"
PROCESSES, CLIENTS, MAX_TOKENS = 3, 50, 64


def config(mode: str, sim_url: str, redis: str, limit: int, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "backends": {"big": {"url": sim_url + "/v1", "model": "sim", "slots": 512,
                             "queue_limit": 512}},
        "routes": {"chat": {"primary": "big", "overflow": "reject"}},
        "auth": {"enabled": True, "keys": [{
            "id": "k", "tenant": "t", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
            "budgets": [{"period": "month", "tokens": limit}]}]},
        "logging": {"access": False},
    }
    if mode == "redis":
        out["coordination"] = {"mode": "redis", "url": redis,
                               "key_prefix": prefix}
    return out


async def client(session: aiohttp.ClientSession, gateway: Server, used: list[int],
                 refusals: dict[str, int]) -> None:
    body = orjson.dumps({"model": "chat", "max_tokens": MAX_TOKENS,
                         "messages": [{"role": "user", "content": "Count to ten."}]})
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    while True:
        async with session.post(gateway.url + "/v1/chat/completions", data=body,
                                headers=headers) as resp:
            answer = await resp.read()
            if resp.status != 200:
                reason = resp.headers.get("x-slotgate-reject-reason", str(resp.status))
                refusals[reason] = refusals.get(reason, 0) + 1
                return
            used.append(int(orjson.loads(answer)["usage"]["total_tokens"]))


async def run_arm(gateways: list[Server]) -> tuple[list[int], dict[str, int]]:
    used: list[int] = []
    refusals: dict[str, int] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session, gateways[i % PROCESSES], used, refusals)
                               for i in range(PROCESSES * CLIENTS)))
    return used, refusals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=30_000)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    print(f"budget {args.limit:,} tokens; {PROCESSES} processes x {CLIENTS} clients, "
          f"max_tokens {MAX_TOKENS}")
    print("\n| book | answered | tokens served | overshoot (tokens) | overshoot (requests) "
          "| refusals |")
    print("|---|---|---|---|---|---|")
    with Processes() as procs:
        sim = procs.start_simulator(seqs=1024, output_tokens=MAX_TOKENS)
        for mode in ("local", "redis"):
            conf = config(mode, sim.url, args.redis, args.limit,
                          f"bench-{uuid.uuid4().hex[:8]}")  # one book for the three
            gateways = [procs.serve(conf, f"{mode}-{i}") for i in range(PROCESSES)]
            used, refusals = asyncio.run(run_arm(gateways))
            over = sum(used) - args.limit
            print(f"| {mode} | {len(used):,} | {sum(used):,} | {over:,} | "
                  f"{over / max(used):.2f} | {refusals} |", flush=True)


if __name__ == "__main__":
    main()
