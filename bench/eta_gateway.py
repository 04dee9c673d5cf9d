"""ETA accuracy end to end: what a queued stream is told vs how long it really waits.

Ten users, three slots, through a real gateway (in-process, on the embedded config's
simulated 70B: ~0.4 s to first token, ~30 tokens/s, varied lengths) with the intent
fallback and overflow off, so the queue forms. Each round sends 8 streams at once (3 run,
5 queue); for every queued one, the first `eta_s` the gateway announces is compared with
its real queue wait, and so is the naive (position / slots) x mean-hold formula computed
from the same pool at the same instant. Rounds run back to back on one gateway, so the
estimator learns as a deployment would. Usage: .venv/bin/python bench/eta_gateway.py
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
from dataclasses import dataclass

import aiohttp
import orjson

from policies.config import FallbackWhen, Overflow
from router.app import RunningGateway, start_gateway
from router.config import load_config

ROUTE = "llama-70b"


@dataclass
class Sample:
    ours_s: float
    naive_s: float
    actual_s: float


def config() -> object:
    base = load_config(None)
    route = base.routes[ROUTE]
    fallback = route.fallback.model_copy(update={"when": FallbackWhen.NEVER})
    route = route.model_copy(update={"fallback": fallback, "overflow": Overflow.REJECT})
    return base.model_copy(update={"routes": {**base.routes, ROUTE: route}})


async def one(http: aiohttp.ClientSession, gw: RunningGateway, max_tokens: int,
              out: list[Sample]) -> None:
    pool = gw.gateway.backends[ROUTE].pool
    body = {"model": ROUTE, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "Explain how a slot pool works."}]}
    headers = {"X-Slotgate-Queue-Events": "true"}
    first: tuple[float, float] | None = None
    event = None
    async with http.post(gw.url + "/v1/chat/completions", json=body, headers=headers) as resp:
        async for raw in resp.content:
            line = raw.strip()
            if line.startswith(b"event:"):
                event = line[6:].strip()
            elif line.startswith(b"data:") and event == b"queue_status":
                data = orjson.loads(line[5:])
                if first is None:
                    naive = data["position"] / pool.capacity * pool.estimator.mean_s
                    first = (float(data["eta_s"]), naive)
                event = None
            elif line.startswith(b"data:") and event == b"start":
                waited = orjson.loads(line[5:])["queue_wait_ms"] / 1000
                if first is not None:
                    out.append(Sample(first[0], first[1], waited))
                event = None


def errors(samples: list[Sample], pick: str) -> tuple[float, float]:
    rel = sorted(abs(getattr(s, pick) - s.actual_s) / s.actual_s
                 for s in samples if s.actual_s >= 0.05)
    return statistics.median(rel), rel[int(0.9 * (len(rel) - 1))]


async def main(rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    gw = await start_gateway(config(), "127.0.0.1", 0)  # type: ignore[arg-type]
    samples: list[Sample] = []
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(rounds):
                lengths = [rng.randint(20, 100) for _ in range(8)]
                await asyncio.gather(*(one(http, gw, n, samples) for n in lengths))
    finally:
        await gw.close()
    ours, naive = errors(samples, "ours_s"), errors(samples, "naive_s")
    print(f"ten users, three slots, end to end: {len(samples)} queued requests, "
          f"{rounds} rounds")
    print("|predicted - actual| / actual     median     p90")
    print(f"ours (slotgate eta_s)          {ours[0]:>8.1%} {ours[1]:>7.1%}")
    print(f"naive (position/slots x mean)  {naive[0]:>8.1%} {naive[1]:>7.1%}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.seed))
