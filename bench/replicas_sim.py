"""The replica bench's trace in virtual time: what the pick alone does to time to first token.

`bench/replicas.py` plays its multi-turn trace against real gateway processes, where the
box's CPU and the event loops add their noise to every figure. This plays the same trace
(sessions, tenants' system prompts, think times, Poisson arrivals) through a model with
no network, no processes and no clock: four engines of four slots with the simulated
engine's prefix cache and timing (`router.upstream.simulated`: TTFT plus the prefill of
the uncached prompt tokens, then the decode), one first-come, first-served line for the
group, and the gateway's own pick (`policies.scheduler.pick`, `policies.scheduler.prefix`)
with its load accounting. A waiter takes the replica whose slot freed first, as in the
gateway (with `+look_ahead`, the pool's bounded look-ahead for waiters). Every run is
deterministic: the seeds are the only variation, so a difference between policies
is the policies'.

    .venv/bin/python bench/replicas_sim.py [--sessions 72] [--loads 0.8 1.2] [--seeds 1 2 3]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from replicas import (
    ANSWER_BYTES,
    BYTES_PER_TOKEN,
    COLD_TOKENS,
    REPLICAS,
    SLOTS,
    SPEC,
    TENANTS,
    Session,
    service_s,
    system_prompt,
    trace,
)

from policies.clock.lengths import OUTPUT_PRIOR
from policies.scheduler import pick
from policies.scheduler.capabilities import estimate_tokens
from policies.scheduler.prefix import BLOCK_BYTES, AffinityTable, block_hashes, request_text
from router.upstream.simulated.cache import PrefixCache

POLICIES = ("round_robin", "least_loaded", "affinity", "affinity+look_ahead")
LOOK_AHEAD, MAX_BYPASS = 4, 2  # as `affinity.look_ahead` and `max_bypass` in the config
ANSWER = ("the quick brown fox jumps over a lazy dog again and so " * 4)[:ANSWER_BYTES]


@dataclass
class Engine:
    name: str
    cache: PrefixCache
    active: int = 0
    load_tokens: int = 0


@dataclass
class Request:
    session: Session
    turn: int
    messages: list[dict[str, str]]
    arrived_s: float
    hashes: list[int] = field(default_factory=list)  # the gateway's blocks
    tokens: int = 0  # the gateway's estimate: prompt plus expected output
    want: str | None = None  # waiting: the replica holding its longest prefix
    bypassed: int = 0  # waiting: waiters behind it served first


@dataclass
class Served:
    ttft_s: float  # client-side: the wait in line plus the engine's TTFT
    engine_ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    waited: bool


class Group:
    """The gateway's line and pick over the engines, in virtual time."""

    def __init__(self, policy: str) -> None:
        mode, _, look = policy.partition("+")
        self.mode, self.look_ahead = pick.PickMode(mode), LOOK_AHEAD if look else 0
        self.engines = {f"group-{i}": Engine(f"group-{i}", PrefixCache(
            SPEC["prefix_cache_tokens"], SPEC["cache_block_tokens"])) for i in range(REPLICAS)}
        self.table = AffinityTable(1 << 16)
        self.line: deque[Request] = deque()
        self.cursor = 0

    def choose(self, request: Request) -> str | None:
        snapshot = [pick.Replica(e.name, SLOTS, e.active, e.load_tokens)
                    for e in self.engines.values()]
        match = self.table.match(request.hashes)
        choice = pick.pick(snapshot, request.tokens, mode=self.mode, prefix=match,
                           session=request.session.name, cursor=self.cursor,
                           warm_tokens=match.blocks * BLOCK_BYTES // BYTES_PER_TOKEN)
        if choice is None:
            return None
        self.cursor = choice.cursor
        return choice.replica

    def next_waiter(self, replica: str) -> Request:
        """The head of the line, or with the look-ahead the first of the first few that
        wants `replica` (none passed over more than MAX_BYPASS times): as the pool does."""
        ahead: list[Request] = []
        for request in itertools.islice(self.line, self.look_ahead):
            if request.want == replica:
                for passed in ahead:
                    passed.bypassed += 1
                self.line.remove(request)
                return request
            if request.bypassed >= MAX_BYPASS:
                break
            ahead.append(request)
        return self.line.popleft()


def simulate(policy: str, sessions: Sequence[Session], systems: Sequence[str]) -> list[Served]:
    group, served = Group(policy), []
    events: list[tuple[float, int, str, object]] = []
    order = itertools.count()

    def at(when: float, kind: str, what: object) -> None:
        heapq.heappush(events, (when, next(order), kind, what))

    def start(request: Request, name: str, now: float) -> None:
        engine = group.engines[name]
        engine.active += 1
        engine.load_tokens += request.tokens
        group.table.record(request.hashes, name)
        text = request_text({"messages": request.messages})
        prompt = max(1, sum(len(m["content"]) for m in request.messages) // 4)
        blocks = block_hashes(text, engine.cache.block_bytes)
        cached = engine.cache.lookup(blocks, prompt)
        ttft = SPEC["ttft_s"] + (prompt - cached) * SPEC["prefill_s_per_token"]
        served.append(Served(now - request.arrived_s + ttft, ttft, prompt, cached,
                             now > request.arrived_s))
        at(now + ttft, "prefilled", (engine, blocks))
        at(now + ttft + (SPEC["output_tokens"] - 1) / SPEC["tokens_per_s"], "done",
           (request, engine))

    def arrive(session: Session, turn: int, messages: list[dict[str, str]], now: float) -> None:
        messages = [*messages, {"role": "user", "content": session.questions[turn]}]
        request = Request(session, turn, messages, now)
        text = request_text({"messages": messages})
        request.hashes = block_hashes(text)
        request.tokens = (estimate_tokens(len(text), len(text.encode()))
                          + OUTPUT_PRIOR)
        name = group.choose(request) if not group.line else None
        if name is None:
            request.want = group.table.match(request.hashes).replica
            group.line.append(request)
        else:
            start(request, name, now)

    for session in sessions:
        at(session.arrives_s, "arrive",
           (session, 0, [{"role": "system", "content": systems[session.tenant]}]))
    while events:
        now, _, kind, what = heapq.heappop(events)
        if kind == "arrive":
            arrive(*what, now)  # type: ignore[misc]
        elif kind == "prefilled":
            engine, blocks = what  # type: ignore[misc]
            engine.cache.insert(blocks)
        else:
            request, engine = what  # type: ignore[misc]
            engine.active -= 1
            engine.load_tokens -= request.tokens
            if group.line:  # a waiter takes the slot that freed, no pick
                start(group.next_waiter(engine.name), engine.name, now)
            if request.turn + 1 < len(request.session.questions):
                at(now + request.session.thinks_s[request.turn], "arrive",
                   (request.session, request.turn + 1,
                    [*request.messages, {"role": "assistant", "content": ANSWER}]))
    return served


@dataclass
class Row:
    policy: str
    load: float
    seed: int
    p50: float
    p99: float
    engine_p50: float
    engine_p99: float
    hits: float
    cold: int
    waited: float


def measure(policy: str, load: float, seed: int, sessions: int) -> Row:
    rng = random.Random(seed)
    systems = [system_prompt(t, rng) for t in range(TENANTS)]
    probe = trace(sessions, 1.0, seed)
    capacity = REPLICAS * SLOTS / service_s(probe)
    played = trace(sessions, load * capacity / len(probe[0].questions), seed)
    served = simulate(policy, played, systems)
    ttfts = sorted(s.ttft_s for s in served)
    engine = sorted(s.engine_ttft_s for s in served)
    return Row(policy, load, seed, statistics.median(ttfts),
               statistics.quantiles(ttfts, n=100)[98], statistics.median(engine),
               statistics.quantiles(engine, n=100)[98],
               sum(s.cached_tokens for s in served) / sum(s.prompt_tokens for s in served),
               sum(s.prompt_tokens - s.cached_tokens >= COLD_TOKENS for s in served),
               sum(s.waited for s in served) / len(served))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=72)
    parser.add_argument("--loads", type=float, nargs="+", default=[0.8, 1.2])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    args = parser.parse_args()
    rows = [measure(policy, load, seed, args.sessions)
            for load in args.loads for seed in args.seeds for policy in args.policies]
    print(f"{REPLICAS} replicas x {SLOTS} slots, {args.sessions} sessions x "
          f"{len(trace(1, 1.0, 0)[0].questions)} turns, virtual time; capacity from the "
          f"spec's service time\n")
    print("| load | seed | policy | TTFT p50 (s) | TTFT p99 (s) | engine TTFT p50 / p99 (s) "
          "| prefix hits | cold | waited |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.load:.1f}x | {r.seed} | {r.policy} | {r.p50:.3f} | {r.p99:.3f} | "
              f"{r.engine_p50:.3f} / {r.engine_p99:.3f} | {r.hits:.0%} | {r.cold} | "
              f"{r.waited:.0%} |")
    for arm in ("affinity", "affinity+look_ahead"):
        print(f"\n{arm} / least_loaded, same load and seed: TTFT p50 / p99")
        for load in args.loads:
            ratios = []
            for seed in args.seeds:
                at = {r.policy: r for r in rows if r.load == load and r.seed == seed}
                if arm in at and "least_loaded" in at:
                    ratios.append((at[arm].p50 / at["least_loaded"].p50,
                                   at[arm].p99 / at["least_loaded"].p99))
            print(f"  {load:.1f}x: " + ", ".join(f"x{a:.2f} / x{b:.2f}" for a, b in ratios))


if __name__ == "__main__":
    main()
