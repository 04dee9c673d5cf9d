"""A replica group's pick under a multi-turn workload: round_robin, least_loaded, affinity
and affinity with the waiters' look-ahead side by side, time to first token and the
engines' prefix-cache hits.

One backend of four simulated replicas of four slots, each engine with a prefix cache, so a
prompt prefilled on a replica that holds its prefix costs only its new tokens. Sessions of
a few tenants (each with a long system prompt of its own) arrive as a Poisson process; a
session's turns each carry its whole conversation so far plus a new user message, and the
next starts a short think time after the previous answer ends. The same trace is played
against one gateway per policy, at 0.8x and 1.2x of the group's capacity without affinity
(16 slots over the mean engine time per request of a short least_loaded calibration run),
the policy order rotated between loads. Each gateway runs in a
process of its own (the engines in it), the clients in this one.

Prints per policy and load: client-measured TTFT p50/p99 (to the first content chunk of
a stream), the engines' prefix hit rate (cached over prompt tokens), max/mean tokens
(prompt plus completion) and requests per replica, the gateway's picks by reason, and
ratios of affinity to the others; then the pick's cost (bench/pick_cost.py, smaller).

    .venv/bin/python bench/replicas.py [--sessions 72] [--loads 0.8 1.2] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
import orjson

# affinity+look_ahead: affinity, and a slot freed on a replica goes to one of the first four
# waiters whose prefix it holds (none passed over more than twice).
POLICIES = ("round_robin", "least_loaded", "affinity", "affinity+look_ahead")
REPLICAS, SLOTS, TURNS, TENANTS = 4, 4, 8, 4
BYTES_PER_TOKEN = 4  # as the simulated engine counts a prompt
SPEC = {"max_num_seqs": SLOTS, "ttft_s": 0.02, "prefill_s_per_token": 0.0005,
        "tokens_per_s": 200, "output_tokens": 40, "prefix_cache_tokens": 16_000,
        "cache_block_tokens": 16}
ANSWER_BYTES = 183  # the simulated engine's 40-token answer
COLD_TOKENS = 1_000  # a prefill this long is a system prompt (~2,000 tokens) not cached
THINK_S = 0.3  # mean think time between an answer and the session's next turn
WORDS = ("kernel", "cache", "token", "slot", "route", "replica", "prefix", "queue", "batch",
         "tenant", "session", "latency", "budget", "answer", "question", "model", "engine")


@dataclass
class Session:
    name: str
    tenant: int
    arrives_s: float
    questions: list[str]
    thinks_s: list[float]


@dataclass
class Turn:
    session: str
    turn: int
    ttft_s: float | None
    failed: bool = False


def system_prompt(tenant: int, rng: random.Random) -> str:
    """About 2,000 tokens of a tenant's own instructions."""
    text = f"You are tenant {tenant}'s assistant. "
    while len(text) < 2_000 * BYTES_PER_TOKEN:
        text += " ".join(rng.choices(WORDS, k=12)) + ". "
    return text


def trace(sessions: int, rate_per_s: float, seed: int) -> list[Session]:
    """Sessions arriving at `rate_per_s` (Poisson), each of a random tenant."""
    rng = random.Random(seed)
    clock, out = 0.0, []
    for i in range(sessions):
        clock += rng.expovariate(rate_per_s)
        questions = [" ".join(rng.choices(WORDS, k=rng.randint(25, 60))) for _ in range(TURNS)]
        thinks = [rng.expovariate(1 / THINK_S) for _ in range(TURNS)]
        out.append(Session(f"session-{i:03d}", rng.randrange(TENANTS), clock, questions,
                           thinks))
    return out


def service_s(sessions: Sequence[Session]) -> float:
    """Mean service time of the trace's requests when a replica's cache holds the system
    prompt but not the conversation: TTFT, the conversation's prefill, the decode."""
    uncached = []
    for session in sessions:
        history = 0
        for question in session.questions:
            history += len(question)
            uncached.append(history / BYTES_PER_TOKEN)
            history += ANSWER_BYTES
    spec = SPEC
    return (spec["ttft_s"] + spec["prefill_s_per_token"] * statistics.fmean(uncached)
            + (spec["output_tokens"] - 1) / spec["tokens_per_s"])


def config(policy: str) -> dict[str, Any]:
    endpoints = [{"simulated": {**SPEC, "seed": i}, "slots": SLOTS} for i in range(REPLICAS)]
    pick, _, look = policy.partition("+")
    group: dict[str, Any] = {"model": "m", "endpoints": endpoints, "pick": pick,
                             "queue_limit": 5_000, "queue_timeout_s": 600}
    if look:
        group["affinity"] = {"look_ahead": 4, "max_bypass": 2}
    return {"backends": {"group": group}, "routes": {"chat": {"primary": "group"}}}


def serve(policy: str, conn: Connection) -> None:
    """The gateway process: serve until told to stop, then report what the engines saw."""
    asyncio.run(_serve(policy, conn))


async def _serve(policy: str, conn: Connection) -> None:
    from router.app import start_gateway
    from router.config import config_from_dict

    gw = await start_gateway(config_from_dict(config(policy)), "127.0.0.1", 0)
    try:
        conn.send(gw.url)
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        engines = {}  # per replica, per request: prompt, cached, completion tokens, busy s,
        # planned TTFT s (TTFT plus the uncached prefill: the cache's part, no queue, no CPU)
        for name, replica in gw.gateway.backends["group"].replicas.items():
            assert replica.simulator is not None
            engines[name] = [(r.prompt_tokens, r.cached_tokens, r.completion_tokens,
                              (r.ended_at or r.started_at) - r.started_at,
                              r.planned_ttft_s or 0.0)
                             for r in replica.simulator.engine.records.values() if r.completed]
        picks = Counter(r.pick or "waited" for r in gw.gateway.recent if r.backend)
        conn.send((engines, dict(picks)))
    finally:
        await gw.close()


async def turn(http: aiohttp.ClientSession, url: str, session: Session,
               messages: list[dict[str, str]], n: int) -> tuple[Turn, str]:
    """One streamed request: the time to its first content chunk, and its answer."""
    body = {"model": "chat", "messages": messages, "stream": True, "user": session.name}
    began = time.perf_counter()
    first, parts = None, []
    try:
        async with http.post(f"{url}/v1/chat/completions", data=orjson.dumps(body),
                             headers={"Content-Type": "application/json"}) as resp:
            if resp.status != 200:
                return Turn(session.name, n, None, failed=True), ""
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                choices = orjson.loads(line[6:]).get("choices") or [{}]
                text = (choices[0].get("delta") or {}).get("content")
                if text:
                    first = first if first is not None else time.perf_counter() - began
                    parts.append(text)
    except aiohttp.ClientError:
        return Turn(session.name, n, None, failed=True), ""
    return Turn(session.name, n, first, failed=first is None), "".join(parts)


async def converse(http: aiohttp.ClientSession, url: str, session: Session, system: str,
                   start: float) -> list[Turn]:
    await asyncio.sleep(max(0.0, start + session.arrives_s - time.perf_counter()))
    messages = [{"role": "system", "content": system}]
    done = []
    for n, question in enumerate(session.questions):
        messages.append({"role": "user", "content": question})
        result, answer = await turn(http, url, session, messages, n)
        done.append(result)
        messages.append({"role": "assistant", "content": answer})
        await asyncio.sleep(session.thinks_s[n])
    return done


async def play(url: str, sessions: Sequence[Session], systems: Sequence[str]) -> list[Turn]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=600)) as http:
        start = time.perf_counter()
        runs = [converse(http, url, s, systems[s.tenant], start) for s in sessions]
        return [t for done in await asyncio.gather(*runs) for t in done]


@dataclass
class Row:
    policy: str
    load: float
    p50: float
    p99: float
    hit: float
    max_mean_tokens: float
    max_mean_requests: float
    engine_p50: float  # the engines' planned TTFT: the prefix cache's share of it
    engine_p99: float
    cold: int  # requests that prefilled 1,000 tokens or more (a system prompt not cached)
    busy: float  # engine busy time over slot time of the run
    service_s: float  # mean engine time per request
    failed: int
    picks: dict[str, int]  # "waited": queued, then took the first slot freed

    @property
    def waited(self) -> float:
        return self.picks.get("waited", 0) / max(sum(self.picks.values()), 1)


def run(policy: str, load: float, sessions: Sequence[Session], systems: Sequence[str]) -> Row:
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    process = context.Process(target=serve, args=(policy, theirs), daemon=True)
    process.start()
    try:
        if not ours.poll(60):
            raise RuntimeError(f"the {policy} gateway did not start")
        url = ours.recv()
        began = time.perf_counter()
        turns = asyncio.run(play(url, sessions, systems))
        took = time.perf_counter() - began
        ours.send("stop")
        if not ours.poll(60):
            raise RuntimeError(f"the {policy} gateway did not report")
        engines, picks = ours.recv()
    finally:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
    ttfts = sorted(t.ttft_s for t in turns if t.ttft_s is not None)
    records = [r for rs in engines.values() for r in rs]
    planned = sorted(r[4] for r in records)
    tokens = [sum(p + c for p, _, c, *_ in rs) for rs in engines.values()]
    counts = [len(rs) for rs in engines.values()]
    return Row(policy, load, statistics.median(ttfts), statistics.quantiles(ttfts, n=100)[98],
               sum(c for _, c, *_ in records) / sum(p for p, *_ in records),
               max(tokens) / statistics.fmean(tokens), max(counts) / statistics.fmean(counts),
               statistics.median(planned), statistics.quantiles(planned, n=100)[98],
               sum(p - c >= COLD_TOKENS for p, c, *_ in records),
               sum(r[3] for r in records) / (REPLICAS * SLOTS * took),
               statistics.fmean(r[3] for r in records), sum(t.failed for t in turns), picks)


def report(rows: Sequence[Row]) -> None:
    print("| load | policy | TTFT p50 (s) | TTFT p99 (s) | engine TTFT p50 / p99 (s) "
          "| prefix hits | cold | max/mean tokens | max/mean requests | busy | service (s) "
          "| waited | failed | picks |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: (r.load, POLICIES.index(r.policy))):
        picks = ", ".join(f"{k} {v}" for k, v in sorted(r.picks.items()) if k != "waited")
        print(f"| {r.load:.1f}x | {r.policy} | {r.p50:.3f} | {r.p99:.3f} | "
              f"{r.engine_p50:.3f} / {r.engine_p99:.3f} | {r.hit:.0%} | {r.cold} | "
              f"{r.max_mean_tokens:.2f} | {r.max_mean_requests:.2f} | {r.busy:.0%} | "
              f"{r.service_s:.2f} | {r.waited:.0%} | {r.failed} | {picks} |")
    print("\naffinity / other, same load and run:")
    print("| load | vs | TTFT p50 | TTFT p99 | engine TTFT p50 |")
    print("|---|---|---|---|---|")
    for load in sorted({r.load for r in rows}):
        at = {r.policy: r for r in rows if r.load == load}
        if "affinity" not in at:
            continue
        mine = at["affinity"]
        for other in (p for p in POLICIES if p != "affinity" and p in at):
            them = at[other]
            print(f"| {load:.1f}x | {other} | {mine.p50 / them.p50:.2f} | "
                  f"{mine.p99 / them.p99:.2f} | {mine.engine_p50 / them.engine_p50:.2f} |")


def pick_cost() -> None:
    """bench/pick_cost.py on its 16-replica table of 10,000 conversations, fewer requests."""
    import sys

    import pick_cost as cost

    argv, sys.argv = sys.argv, ["pick_cost.py", "--requests", "5000", "--rounds", "2"]
    try:
        cost.main()
    finally:
        sys.argv = argv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=72)
    parser.add_argument("--loads", type=float, nargs="+", default=[0.8, 1.2])
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-pick-cost", action="store_true")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    systems = [system_prompt(t, rng) for t in range(TENANTS)]
    nominal = REPLICAS * SLOTS / service_s(trace(args.sessions, 1.0, args.seed))
    calibration = run("least_loaded", 0.6, trace(24, 0.6 * nominal / TURNS, args.seed + 1),
                      systems)
    capacity = REPLICAS * SLOTS / calibration.service_s
    print(f"{REPLICAS} replicas x {SLOTS} slots; {args.sessions} sessions x {TURNS} turns, "
          f"{TENANTS} tenants (system prompts ~{len(systems[0]) // BYTES_PER_TOKEN:,} tokens); "
          f"service without affinity {calibration.service_s:.2f} s measured (24 sessions, "
          f"least_loaded; {REPLICAS * SLOTS / nominal:.2f} s by the spec): capacity "
          f"~{capacity:.1f} requests/s")
    rows, order = [], list(args.policies)
    for load in args.loads:
        sessions = trace(args.sessions, load * capacity / TURNS, args.seed)
        print(f"\n{load:.1f}x: {load * capacity:.1f} requests/s offered, sessions over "
              f"{sessions[-1].arrives_s:.0f} s; order {', '.join(order)}", flush=True)
        for policy in order:
            row = run(policy, load, sessions, systems)
            print(f"  {policy}: p50 {row.p50:.3f} s, p99 {row.p99:.3f} s, hits {row.hit:.0%}",
                  flush=True)
            rows.append(row)
        order = order[1:] + order[:1]
    print()
    report(rows)
    if not args.no_pick_cost:
        print()
        pick_cost()


if __name__ == "__main__":
    main()
