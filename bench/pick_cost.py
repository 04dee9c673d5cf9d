"""What choosing a replica costs per request: rendering and hashing the prompt, matching the
affinity table, the pick itself, and recording the choice.

A group of 16 replicas (random loads, a few busy, one unhealthy) and an affinity table
holding 10,000 conversations (a shared system prompt, then their own turns). Each timed
request is one of those conversations plus a new user turn. Median and p99 of single
calls in microseconds, each the best of a few rounds (other work on the box only adds), and
the median as a ratio to the baseline of the same run: `pick` in least_loaded mode (no
prefix, no session), the least a pick can cost. Hashing long prompts is timed apart: its
cost grows with the prompt, the rest does not. No I/O.

    .venv/bin/python bench/pick_cost.py [--requests 20000] [--sessions 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable

from policies.scheduler.pick import PickMode, Replica, pick
from policies.scheduler.prefix import AffinityTable, block_hashes, request_text

REPLICAS = 16
TOKENS = 1500
SYSTEM = {"role": "system", "content": "You are a careful assistant. Answer briefly. " * 24}


def group(rng: random.Random) -> list[Replica]:
    replicas = [Replica(f"replica-{i:02d}", 8, rng.randint(0, 8), rng.randint(0, 40_000),
                        penalty=rng.choice([0.0, 0.0, 0.2])) for i in range(REPLICAS)]
    replicas[3] = Replica("replica-03", 8, 0, 0, healthy=False)
    return replicas


def conversation(rng: random.Random, turns: int) -> list[dict[str, str]]:
    words = ["alpha", "beta", "gamma", "delta", "kernel", "cache", "token", "slot", "route"]
    return [SYSTEM] + [
        {"role": "user" if i % 2 == 0 else "assistant",
         "content": " ".join(rng.choices(words, k=rng.randint(20, 150)))}
        for i in range(turns)]


def timed(fn: Callable[[int], object], count: int, rounds: int) -> tuple[float, float]:
    """Median and p99 in microseconds of `count` calls fn(i), each the least over rounds."""
    clock = time.perf_counter_ns
    medians, tails = [], []
    for _ in range(rounds):
        gc.collect()
        took = []
        for i in range(count):
            began = clock()
            fn(i)
            took.append((clock() - began) / 1000)
        medians.append(statistics.median(took))
        tails.append(statistics.quantiles(took, n=100)[98])
    return min(medians), min(tails)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(7)
    replicas = group(rng)
    names = [r.name for r in replicas if r.name != "replica-03"]
    sessions = [conversation(rng, rng.randint(1, 12)) for _ in range(args.sessions)]
    tracemalloc.start()
    table = AffinityTable(1 << 18)
    for messages in sessions:
        table.record(block_hashes(request_text({"messages": messages})), rng.choice(names))
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    ask = [rng.randrange(args.sessions) for _ in range(args.requests)]
    bodies = [{"messages": [*sessions[s], {"role": "user", "content": "And then? " * 8}],
               "user": f"user-{s}"} for s in ask]
    keys = [f"user-{s}" for s in ask]
    texts = [request_text(body) for body in bodies]
    hashes = [block_hashes(text) for text in texts]
    matches = [table.match(h) for h in hashes]
    sizes = sorted(len(text.encode()) for text in texts)
    print(f"{REPLICAS} replicas; {args.sessions:,} conversations in the table ({len(table):,} "
          f"blocks, {held / len(table):.0f} B each); {args.requests:,} requests, prompts "
          f"{sizes[0]:,} to {sizes[-1]:,} B (median {sizes[len(sizes) // 2]:,}); "
          f"{sum(m.blocks > 0 for m in matches) / len(matches):.0%} matched")

    def whole(i: int) -> None:
        body = bodies[i]
        found = block_hashes(request_text(body))
        chosen = pick(replicas, TOKENS, prefix=table.match(found), session=str(body["user"]))
        if chosen is not None:
            table.record(found, chosen.replica)

    def run(fn: Callable[[int], object]) -> tuple[float, float]:
        return timed(fn, args.requests, args.rounds)

    rows = [
        ("pick, least_loaded (baseline)",
         run(lambda i: pick(replicas, TOKENS, mode=PickMode.LEAST_LOADED))),
        ("pick, round_robin",
         run(lambda i: pick(replicas, TOKENS, mode=PickMode.ROUND_ROBIN, cursor=i))),
        ("pick, affinity (prefix known)", run(lambda i: pick(replicas, TOKENS, prefix=matches[i]))),
        ("pick, affinity (session only)", run(lambda i: pick(replicas, TOKENS, session=keys[i]))),
        ("table.match", run(lambda i: table.match(hashes[i]))),
        ("request_text", run(lambda i: request_text(bodies[i]))),
        ("block_hashes", run(lambda i: block_hashes(texts[i]))),
        ("whole: text + hashes + match + pick + record", run(whole)),
    ]
    baseline = rows[0][1][0]
    print(f"best of {args.rounds} rounds")
    print("| step | median (us) | p99 (us) | median / baseline |")
    print("|---|---|---|---|")
    for name, (middle, tail) in rows:
        print(f"| {name} | {middle:.1f} | {tail:.1f} | {middle / baseline:.1f} |")
    print("\nhashing alone, by prompt size (best of 3 rounds of 200 calls):")
    print("| prompt | request_text median (us) | block_hashes median (us) | p99 (us) | "
          "per KiB (us) |")
    print("|---|---|---|---|---|")
    for kib in (1, 8, 64, 512):
        body = {"messages": [SYSTEM, {"role": "user", "content": "z" * (kib * 1024)}]}
        text = request_text(body)
        render, _ = timed(lambda i, body=body: request_text(body), 200, 3)
        hashing, tail = timed(lambda i, text=text: block_hashes(text), 200, 3)
        print(f"| {kib} KiB | {render:.1f} | {hashing:.1f} | {tail:.1f} | "
              f"{(render + hashing) / (len(text) / 1024):.2f} |")

if __name__ == "__main__":
    main()
