"""A replica group's pick under a multi-turn workload, side by side with sglang-router: time
to first token, cold prefills and conversations kept on their replica, for slotgate's
`pick:` policies (least_loaded, affinity, ...) and SGLang's Rust router (cache_aware).

Four simulated engines of four sequences each, each with a prefix cache, so a prompt
prefilled on an engine that holds its prefix costs only its new tokens; they run in a
process of their own, started afresh for every run, and every arm reaches them over HTTP
(bench/replicas_peer.py). Sessions of a few tenants (each with a long system prompt of its
own) arrive as a Poisson process; a session's turns each carry its whole conversation so
far plus a new user message, and the next starts a short think time after the previous
answer ends. The same trace is played through each arm: a slotgate gateway per policy (in
a process of its own, four slots per engine, a line in front), or sglang-router
(`--policy cache_aware`, its defaults otherwise; no line of its own: it forwards at once,
and the engines queue what they cannot run). Loads are multiples of the group's capacity
without affinity (16 slots over the mean engine time per request of a short least_loaded
calibration run, one per tenant count); the arm order rotates from run to run.

Prints per run, then per (tenants, load) cell each arm's median over the seeds, and the
ratios affinity / sglang and affinity / least_loaded as the median of the per-seed ratios:
client-measured TTFT p50/p99 (to the first content chunk of a stream), the engines'
planned TTFT (the prefix cache's share), prefix hits (cached over prompt tokens), cold
prefills (1,000 tokens or more not cached: a system prompt missing), later turns kept on
the replica of the turn before, requests that waited in an engine's own line and in the
router's, and max/mean requests per replica; then the pick's cost (bench/pick_cost.py).

    .venv/bin/python bench/replicas.py [--policies least_loaded affinity sglang]
        [--tenants 8 2] [--loads 0.8 1.2] [--seeds 6] [--sessions 72] [--quick] [--out F]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from replicas_report import SGLANG, Row, ratios, report

# affinity+look_ahead: affinity, and a slot freed on a replica goes to one of the first four
# waiters whose prefix it holds (none passed over more than twice).
POLICIES = ("round_robin", "least_loaded", "affinity", "affinity+look_ahead")
ARMS = (*POLICIES, SGLANG)
REPLICAS, SLOTS, TURNS, TENANTS = 4, 4, 8, 4
BYTES_PER_TOKEN = 4  # as the simulated engine counts a prompt
SPEC = {"max_num_seqs": SLOTS, "ttft_s": 0.02, "prefill_s_per_token": 0.0005,
        "tokens_per_s": 200, "output_tokens": 40, "prefix_cache_tokens": 16_000,
        "cache_block_tokens": 16}
ANSWER_BYTES = 183  # the simulated engine's 40-token answer
COLD_TOKENS = 1_000  # a prefill this long is a system prompt (~2,000 tokens) not cached
QUEUED_S = 0.005  # a request that waited longer than this for an engine's sequence queued
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


def trace(sessions: int, rate_per_s: float, seed: int, tenants: int = TENANTS) -> list[Session]:
    """Sessions arriving at `rate_per_s` (Poisson), each of a random tenant."""
    rng = random.Random(seed)
    clock, out = 0.0, []
    for i in range(sessions):
        clock += rng.expovariate(rate_per_s)
        questions = [" ".join(rng.choices(WORDS, k=rng.randint(25, 60))) for _ in range(TURNS)]
        thinks = [rng.expovariate(1 / THINK_S) for _ in range(TURNS)]
        out.append(Session(f"session-{i:03d}", rng.randrange(tenants), clock, questions,
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


def config(policy: str, engines: Mapping[str, str]) -> dict[str, Any]:
    endpoints = [{"name": name, "url": f"{url}/v1", "slots": SLOTS}
                 for name, url in engines.items()]
    pick, _, look = policy.partition("+")
    group: dict[str, Any] = {"model": "m", "endpoints": endpoints, "pick": pick,
                             "queue_limit": 5_000, "queue_timeout_s": 600}
    if look:
        group["affinity"] = {"look_ahead": 4, "max_bypass": 2}
    return {"backends": {"group": group}, "routes": {"chat": {"primary": "group"}}}


def serve(policy: str, engines: Mapping[str, str], conn: Connection) -> None:
    """The gateway process: serve until told to stop, then report its picks by reason."""
    asyncio.run(_serve(policy, engines, conn))


async def _serve(policy: str, engines: Mapping[str, str], conn: Connection) -> None:
    from router.app import start_gateway
    from router.config import config_from_dict

    gw = await start_gateway(config_from_dict(config(policy, engines)), "127.0.0.1", 0)
    try:
        conn.send(gw.url)
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        picks = Counter(r.pick or "waited" for r in gw.gateway.recent if r.backend)
        conn.send(dict(picks))
    finally:
        await gw.close()


async def turn(http: aiohttp.ClientSession, url: str, model: str, session: Session,
               messages: list[dict[str, str]], n: int) -> tuple[Turn, str]:
    """One streamed request: the time to its first content chunk, and its answer."""
    body = {"model": model, "messages": messages, "stream": True, "user": session.name}
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


async def converse(http: aiohttp.ClientSession, url: str, model: str, session: Session,
                   system: str, start: float) -> list[Turn]:
    await asyncio.sleep(max(0.0, start + session.arrives_s - time.perf_counter()))
    messages = [{"role": "system", "content": system}]
    done = []
    for n, question in enumerate(session.questions):
        messages.append({"role": "user", "content": question})
        result, answer = await turn(http, url, model, session, messages, n)
        done.append(result)
        messages.append({"role": "assistant", "content": answer})
        await asyncio.sleep(session.thinks_s[n])
    return done


async def play(url: str, model: str, sessions: Sequence[Session],
               systems: Sequence[str]) -> list[Turn]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=600)) as http:
        start = time.perf_counter()
        runs = [converse(http, url, model, s, systems[s.tenant], start) for s in sessions]
        return [t for done in await asyncio.gather(*runs) for t in done]


@contextlib.contextmanager
def process(target: Callable[..., None], args: tuple[Any, ...], what: str
            ) -> Iterator[Connection]:
    """`target(*args, conn)` in a spawned process; the other end of its pipe, once it has
    said something."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=target, args=(*args, theirs), daemon=True)
    child.start()
    try:
        if not ours.poll(60):
            raise RuntimeError(f"{what} did not start")
        yield ours
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()


def ask(conn: Connection, what: str) -> Any:
    conn.send("stop")
    if not conn.poll(60):
        raise RuntimeError(f"{what} did not report")
    return conn.recv()


def run(arm: str, tenants: int, load: float, seed: int, sessions: Sequence[Session],
        systems: Sequence[str], sglang: str | None = None) -> Row:
    """One arm over the trace, in front of four fresh engines. `sglang`: the interpreter
    that has sglang-router (the sglang arm)."""
    from peers import Fleet
    from replicas_peer import serve_engines, start_sglang

    picks: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        engines = stack.enter_context(process(serve_engines, (SPEC, REPLICAS), "the engines"))
        urls = engines.recv()
        gateway = None
        if arm == SGLANG:
            assert sglang is not None
            fleet = stack.enter_context(Fleet())
            url, model = start_sglang(fleet, sglang, list(urls.values())).url, "m"
        else:
            gateway = stack.enter_context(process(serve, (arm, urls), f"the {arm} gateway"))
            url, model = gateway.recv(), "chat"
        began = time.perf_counter()
        turns = asyncio.run(play(url, model, sessions, systems))
        took = time.perf_counter() - began
        if gateway is not None:
            picks = ask(gateway, f"the {arm} gateway")
        served = ask(engines, "the engines")
    return measure(arm, tenants, load, seed, sessions, turns, served, took, picks)


def measure(arm: str, tenants: int, load: float, seed: int, sessions: Sequence[Session],
            turns: Sequence[Turn], served: Mapping[str, Sequence[Sequence[Any]]],
            took: float, picks: dict[str, int]) -> Row:
    """The figures of one run from the clients' turns and what each engine served (see
    replicas_peer.Served)."""
    ttfts = sorted(t.ttft_s for t in turns if t.ttft_s is not None)
    records = [r for rs in served.values() for r in rs]
    planned = sorted(r[6] for r in records)
    tokens = [sum(r[2] + r[4] for r in rs) for rs in served.values()]
    counts = [len(rs) for rs in served.values()]
    session_of = {s.questions[0]: s.name for s in sessions}
    where = {(session_of.get(r[0], r[0]), r[1]): name
             for name, rs in served.items() for r in rs}
    later = [(where[key], where[(key[0], key[1] - 1)]) for key in where
             if key[1] > 0 and (key[0], key[1] - 1) in where]
    return Row(arm, tenants, load, seed, statistics.median(ttfts),
               statistics.quantiles(ttfts, n=100)[98], statistics.median(planned),
               statistics.quantiles(planned, n=100)[98],
               sum(r[3] for r in records) / sum(r[2] for r in records),
               sum(r[2] - r[3] >= COLD_TOKENS for r in records),
               sum(now == before for now, before in later) / max(len(later), 1),
               sum(r[7] > QUEUED_S for r in records) / len(records),
               max(counts) / statistics.fmean(counts), max(tokens) / statistics.fmean(tokens),
               sum(r[5] for r in records) / (REPLICAS * SLOTS * took),
               statistics.fmean(r[5] for r in records), sum(t.failed for t in turns), picks)


def pick_cost() -> None:
    """bench/pick_cost.py on its 16-replica table of 10,000 conversations, fewer requests."""
    import sys

    import pick_cost as cost

    argv, sys.argv = sys.argv, ["pick_cost.py", "--requests", "5000", "--rounds", "2"]
    try:
        cost.main()
    finally:
        sys.argv = argv


# ---------------------------------------------------------------- main


def calibrate(tenants: int, sessions: int, seed: int, systems: Sequence[str]) -> float:
    """The group's capacity in requests/s: 16 slots over the mean engine time per request
    of a least_loaded run at 0.6x of the spec's capacity."""
    nominal = REPLICAS * SLOTS / service_s(trace(sessions, 1.0, seed, tenants))
    calibration = run("least_loaded", tenants, 0.6, seed,
                      trace(sessions, 0.6 * nominal / TURNS, seed, tenants), systems)
    return REPLICAS * SLOTS / calibration.service_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", nargs="+", choices=ARMS,
                        default=["least_loaded", "affinity", SGLANG],
                        help="the arms: slotgate's picks, and sglang (sglang-router)")
    parser.add_argument("--tenants", type=int, nargs="+", default=[8, 2],
                        help="tenant counts (system prompts), one cell each")
    parser.add_argument("--loads", type=float, nargs="+", default=[0.8, 1.2])
    parser.add_argument("--seeds", type=int, default=6, help="how many seeds, from --seed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sessions", type=int, help="per run (default 72; --quick 16)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke check: 16 sessions, calibration on 8, no pick cost")
    parser.add_argument("--out", type=Path, help="write every run and the ratios as JSON")
    parser.add_argument("--no-pick-cost", action="store_true")
    args = parser.parse_args()
    sessions = args.sessions or (16 if args.quick else 72)
    calibration_sessions = 8 if args.quick else 24
    arms = list(dict.fromkeys(args.policies))
    notes: list[str] = []
    sglang = version = None
    if SGLANG in arms:
        from replicas_peer import install_sglang, sglang_version

        sglang = install_sglang(notes)
        if sglang is None:
            print(f"sglang-router could not be installed: its arm is skipped ({'; '.join(notes)})")
            arms.remove(SGLANG)
        else:
            version = sglang_version(sglang)
    seeds = [args.seed + i for i in range(args.seeds)]
    print(f"{REPLICAS} engines x {SLOTS} sequences; {sessions} sessions x {TURNS} turns per "
          f"run; arms {', '.join(arms)}"
          + (f" (sglang-router {version}, --policy cache_aware)" if version else "")
          + f"; seeds {', '.join(map(str, seeds))}", flush=True)
    began, rows, capacities, order = time.monotonic(), [], {}, list(arms)
    for tenants in args.tenants:
        rng = random.Random(args.seed)
        systems = [system_prompt(t, rng) for t in range(tenants)]
        capacity = capacities[tenants] = calibrate(tenants, calibration_sessions,
                                                   args.seed + 1, systems)
        print(f"\n{tenants} tenants (system prompts ~{len(systems[0]) // BYTES_PER_TOKEN:,} "
              f"tokens): capacity ~{capacity:.1f} requests/s ({calibration_sessions} "
              f"sessions, least_loaded, at 0.6x)", flush=True)
        for load in args.loads:
            for seed in seeds:
                rng = random.Random(seed)
                systems = [system_prompt(t, rng) for t in range(tenants)]
                played = trace(sessions, load * capacity / TURNS, seed, tenants)
                print(f"  {load:.1f}x, seed {seed}: sessions over {played[-1].arrives_s:.0f} s",
                      flush=True)
                for arm in order:
                    row = run(arm, tenants, load, seed, played, systems, sglang)
                    print(f"    {arm}: p50 {row.p50:.3f} s, p99 {row.p99:.3f} s, cold "
                          f"{row.cold}, kept {row.kept:.0%}, failed {row.failed}", flush=True)
                    rows.append(row)
                order = order[1:] + order[:1]
    print(f"\n{len(rows)} runs in {(time.monotonic() - began) / 60:.1f} min\n")
    report(rows, arms)
    if args.out:
        setup = {"replicas": REPLICAS, "slots": SLOTS, "turns": TURNS, "sessions": sessions,
                 "spec": SPEC, "arms": arms, "seeds": seeds, "loads": args.loads,
                 "tenants": args.tenants, "sglang_router": version,
                 "capacity_per_s": capacities, "notes": notes}
        args.out.write_bytes(orjson.dumps(
            {"setup": setup, "rows": [{**asdict(r), "waited": r.waited} for r in rows],
             "ratios": ratios(rows)}, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))
        print(f"\nwrote {args.out}")
    if not (args.no_pick_cost or args.quick):
        print()
        pick_cost()


if __name__ == "__main__":
    main()
