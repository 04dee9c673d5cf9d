"""A 10:1 noisy neighbour on a saturated pool: `queue_order: fifo` against `fair`, on a
local pool and on one shared through Redis, in one run.

One backend of 2 slots (a simulated engine: 40-token answers at 400 tokens/s), two
tenants with a key each. Per arm (local fifo, local fair, redis fifo, redis fair):

- backlogged: the heavy tenant runs 20 clients back to back, the light one 2: both always
  have requests in the gateway (waiting or running). Jain's fairness index over the tokens
  each tenant was served while both did (1: equal shares; 0.59: shares of 10:1), and each
  tenant's throughput and the total.
- below its share: the heavy tenant's 20 clients again, the light tenant's requests
  arriving as a Poisson stream at 0.1x the pool's capacity (10:1, well under its fair
  half). Its p95 queue wait, against the same arrivals with no neighbour (measured first,
  on each arm).

The cost of a grant (us) is measured apart: a pool's release handing the slot to the
next waiter of 50 tenants' 500, `fifo` against `fair` (`bench/grant_cost.py`).

    .venv/bin/python bench/fairness.py [--seconds 15] [--redis redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson

from policies.limits.jain import jain
from router.app import start_gateway
from router.config import config_from_dict
from router.ledger.base import LedgerRow, RowFilter
from router.ledger.sqlite import SQLiteStore

KEYS = {"heavy": "sk-bench-heavy", "light": "sk-bench-light"}
SLOTS, ANSWER_TOKENS, TOKENS_PER_S, TTFT_S = 2, 40, 400.0, 0.02
HOLD_S = TTFT_S + ANSWER_TOKENS / TOKENS_PER_S
CAPACITY = SLOTS / HOLD_S  # requests per second
HEAVY_CLIENTS, LIGHT_CLIENTS, LIGHT_LOAD = 20, 2, 0.1
ARMS = ("local fifo", "local fair", "redis fifo", "redis fair")


def config(arm: str, ledger: Path, redis: str) -> dict[str, Any]:
    mode, order = arm.split()
    engine = {"max_num_seqs": SLOTS, "ttft_s": TTFT_S, "tokens_per_s": TOKENS_PER_S,
              "output_tokens": ANSWER_TOKENS}
    keys = [{"id": name, "tenant": name, "sha256": hashlib.sha256(key.encode()).hexdigest()}
            for name, key in KEYS.items()]
    out: dict[str, Any] = {
        "backends": {"engine": {"simulated": engine, "model": "m", "slots": SLOTS,
                                "queue_limit": 200, "queue_timeout_s": 120,
                                "queue_order": order}},
        "routes": {"chat": {"primary": "engine"}},
        "auth": {"enabled": True, "keys": keys}, "ledger": {"path": str(ledger)},
    }
    if mode == "redis":
        out["coordination"] = {"mode": "redis", "url": redis,
                               "key_prefix": f"bench-{uuid.uuid4().hex[:8]}"}
    return out


def body(n: int) -> bytes:
    return orjson.dumps({"model": "chat", "max_tokens": ANSWER_TOKENS,
                         "messages": [{"role": "user", "content": f"Say hello ({n})."}]})


async def send(session: aiohttp.ClientSession, url: str, tenant: str, n: int) -> None:
    headers = {"Authorization": f"Bearer {KEYS[tenant]}", "Content-Type": "application/json"}
    async with session.post(url, data=body(n), headers=headers) as resp:
        await resp.read()


async def clients(session: aiohttp.ClientSession, url: str, tenant: str, count: int,
                  until: float) -> None:
    async def loop(i: int) -> None:
        n = 0
        while time.monotonic() < until:
            await send(session, url, tenant, i * 100_000 + n)
            n += 1

    await asyncio.gather(*(loop(i) for i in range(count)))


async def poisson(session: aiohttp.ClientSession, url: str, tenant: str, rate: float,
                  seconds: float, seed: int) -> None:
    rng, began = random.Random(seed), time.monotonic()
    sent: list[asyncio.Task[None]] = []
    at = rng.expovariate(rate)
    while at < seconds:
        await asyncio.sleep(max(0.0, began + at - time.monotonic()))  # the arrival schedule
        sent.append(asyncio.create_task(send(session, url, tenant, len(sent))))
        at += rng.expovariate(rate)
    await asyncio.gather(*sent)


async def phase(arm: str, kind: str, seconds: float, folder: Path, redis: str,
                seed: int) -> list[LedgerRow]:
    path = folder / f"{arm.replace(' ', '-')}-{kind}.sqlite3"
    gw = await start_gateway(config_from_dict(config(arm, path, redis)), "127.0.0.1", 0)
    url = gw.url.rstrip("/") + "/v1/chat/completions"
    until = time.monotonic() + seconds
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            work = []
            if kind != "alone":
                work.append(clients(session, url, "heavy", HEAVY_CLIENTS, until))
            if kind == "backlogged":
                work.append(clients(session, url, "light", LIGHT_CLIENTS, until))
            else:
                work.append(poisson(session, url, "light", LIGHT_LOAD * CAPACITY, seconds,
                                    seed))
            await asyncio.gather(*work)
    finally:
        await gw.close()  # flushes the ledger
    store = SQLiteStore(str(path))
    await store.open()
    try:
        return [r for r in await store.fetch(RowFilter()) if r.status == 200]
    finally:
        await store.close()


def backlogged_shares(rows: list[LedgerRow], step_s: float = 0.01) -> dict[str, float]:
    """Tokens each tenant was served (spread over its slot time) at the instants every
    tenant was backlogged: had a request in the gateway, waiting or running."""
    start = min(r.ts for r in rows)
    end = max(r.ts + (r.queue_wait_ms + r.slot_ms) / 1000 for r in rows)
    ticks = np.arange(start, end, step_s)
    tenants = sorted({r.tenant for r in rows if r.tenant})
    backlogged = {t: np.zeros(len(ticks), dtype=bool) for t in tenants}
    rate = {t: np.zeros(len(ticks)) for t in tenants}
    for r in rows:
        if r.tenant is None:
            continue
        granted = r.ts + r.queue_wait_ms / 1000
        ends = granted + r.slot_ms / 1000
        backlogged[r.tenant] |= (ticks >= r.ts) & (ticks < ends)
        served = (ticks >= granted) & (ticks < ends)
        if served.any():
            rate[r.tenant][served] += (r.prompt_tokens + r.completion_tokens) / served.sum()
    every = np.logical_and.reduce([backlogged[t] for t in tenants])
    return {t: float(rate[t][every].sum()) for t in tenants}


def throughput(rows: list[LedgerRow], tenant: str | None, seconds: float) -> float:
    return sum(r.completion_tokens for r in rows
               if tenant is None or r.tenant == tenant) / seconds


def p95_wait_ms(rows: list[LedgerRow], tenant: str) -> float:
    return float(np.percentile([r.queue_wait_ms for r in rows if r.tenant == tenant], 95))


async def main_async(args: argparse.Namespace) -> None:
    print(f"pool: {SLOTS} slots, {HOLD_S * 1000:.0f} ms per request, capacity "
          f"{CAPACITY:.1f} requests/s; {args.seconds:g} s per phase", flush=True)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for arm in args.arms:
            alone = await phase(arm, "alone", args.seconds, folder, args.redis, args.seed)
            backlog = await phase(arm, "backlogged", args.seconds, folder, args.redis,
                                  args.seed)
            below = await phase(arm, "below", args.seconds, folder, args.redis, args.seed)
            shares = backlogged_shares(backlog)
            results[arm] = {
                "jain": jain(shares) or 0.0,
                "light_share": shares.get("light", 0.0) / max(sum(shares.values()), 1e-9),
                "heavy_tps": throughput(backlog, "heavy", args.seconds),
                "total_tps": throughput(backlog, None, args.seconds),
                "alone_p95": p95_wait_ms(alone, "light"),
                "below_p95": p95_wait_ms(below, "light"),
                "below_heavy_tps": throughput(below, "heavy", args.seconds),
            }
            print(f"  {arm}: done", flush=True)
    show(results)


def show(results: dict[str, dict[str, float]]) -> None:
    print("\n| arm | Jain (backlogged) | light's token share | heavy tokens/s | total tokens/s "
          "| light p95 wait alone (ms) | with the neighbour (ms) | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for arm, r in results.items():
        ratio = r["below_p95"] / max(r["alone_p95"], 1e-9)
        print(f"| {arm} | {r['jain']:.3f} | {r['light_share']:.1%} | {r['heavy_tps']:,.0f} | "
              f"{r['total_tps']:,.0f} | {r['alone_p95']:,.0f} | {r['below_p95']:,.0f} | "
              f"x{ratio:.2f} |")
    for mode in ("local", "redis"):
        fifo, fair = results.get(f"{mode} fifo"), results.get(f"{mode} fair")
        if fifo is None or fair is None:
            continue
        print(f"\n{mode}: fair Jain {fair['jain']:.3f} (target >= 0.95); light p95 wait "
              f"x{fair['below_p95'] / max(fair['alone_p95'], 1e-9):.2f} of alone (target "
              f"<= x1.5); total throughput x{fair['total_tps'] / fifo['total_tps']:.3f} of "
              "fifo (target within 2%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
