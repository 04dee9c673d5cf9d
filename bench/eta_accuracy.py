"""How well queue ETAs predict the real wait: policies.clock.eta vs the naive formula.

A seeded discrete-event simulation of one pool (3 slots, FIFO, bounded queue), no network.
At each ticket's enqueue the estimators predict its wait from past holds only (plus the
ages of the running leases); at its grant the actual wait is known. Prints the median and
p90 of |predicted - actual| / actual (actual < 0.05 s skipped) per scenario and estimator.

    .venv/bin/python bench/eta_accuracy.py [--seeds 5] [--requests 3000] [--rounds 150]
                                           [--reference]

--reference adds a Monte Carlo of the same facts (the last 128 holds, per max_tokens for
the running leases, their ages): the median of 300 simulated drains, a yardstick for how
much of the error is the randomness of the holds rather than the estimator. Slow.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from policies.clock.eta import naive_wait, predict_wait
from policies.clock.holds import HoldTimeModel

CAPACITY = 3
QUEUE_LIMIT = 50
WARMUP = 32  # holds the pool served before the measured run: the model starts warm


@dataclass(frozen=True, slots=True)
class Request:
    arrival: float
    hold: float
    max_tokens: int


@dataclass(frozen=True, slots=True)
class View:
    """What a gateway knows when a ticket is enqueued."""

    model: HoldTimeModel
    ages: list[float]
    tokens: list[int | None]
    position: int
    history: History


@dataclass
class History:
    """The simulator's own copy of the recent holds, for the Monte Carlo reference."""

    recent: deque[float] = field(default_factory=lambda: deque(maxlen=128))
    by_tokens: dict[int, deque[float]] = field(default_factory=dict)
    rng: random.Random = field(default_factory=lambda: random.Random(99))

    def add(self, hold: float, max_tokens: int) -> None:
        self.recent.append(hold)
        self.by_tokens.setdefault(max_tokens, deque(maxlen=128)).append(hold)


def monte_carlo(v: View, draws: int = 300) -> float:
    h, rng = v.history, v.history.rng
    holds = list(h.recent)
    pools = []
    for age, tokens in zip(v.ages, v.tokens, strict=True):
        own = h.by_tokens.get(tokens or 0, deque())
        src = list(own) if len(own) >= 8 else holds
        pools.append([x - age for x in src if x > age] or [0.05 * statistics.fmean(holds)])
    times = []
    for _ in range(draws):
        ends = [rng.choice(p) for p in pools] + [0.0] * (CAPACITY - len(pools))
        heapq.heapify(ends)
        t = 0.0
        for _ in range(v.position):
            t = heapq.heappop(ends)
            heapq.heappush(ends, t + rng.choice(holds))
        times.append(t)
    return statistics.median(times)


Estimator = Callable[[View], float]


def deterministic_sim(v: View) -> float:
    """The simple alternative: expected remainders, then fresh mean holds, no spread."""
    ends = [v.model.expected_remaining(a) for a in v.ages]
    ends += [0.0] * (CAPACITY - len(ends))
    heapq.heapify(ends)
    hold = v.model.distribution().mean_s
    t = 0.0
    for _ in range(v.position):
        t = heapq.heappop(ends)
        heapq.heappush(ends, t + hold)
    return t


ESTIMATORS: dict[str, Estimator] = {
    "ours (ages)": lambda v: predict_wait(v.model, v.ages, CAPACITY, v.position),
    "ours (ages+max_tokens)": lambda v: predict_wait(
        v.model, v.ages, CAPACITY, v.position, active_max_tokens=v.tokens),
    "deterministic sim": deterministic_sim,
    "naive, EWMA mean": lambda v: naive_wait(v.model.mean_s, CAPACITY, v.position),
    "naive, window mean": lambda v: naive_wait(
        v.model.distribution().mean_s, CAPACITY, v.position),
}


@dataclass
class Tally:
    errors: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in ESTIMATORS})
    predict_s: float = 0.0
    predictions: int = 0


def simulate(requests: list[Request], model: HoldTimeModel, tally: Tally,
             history: History) -> None:
    """FIFO pool: departures before arrivals at equal times; a full queue drops arrivals."""
    running: list[tuple[float, float, int, int]] = []  # (end, start, max_tokens, id)
    queue: deque[tuple[Request, float, dict[str, float]]] = deque()

    def start(req: Request, now: float, ident: int) -> None:
        heapq.heappush(running, (now + req.hold, now, req.max_tokens, ident))

    ident = 0
    pending = deque(sorted(requests, key=lambda r: r.arrival))
    while pending or running:
        if running and (not pending or running[0][0] <= pending[0].arrival):
            now, began, tokens, _ = heapq.heappop(running)
            model.observe(now - began, tokens)
            history.add(now - began, tokens)
            if queue:
                req, enqueued, predicted = queue.popleft()
                record(tally, predicted, now - enqueued)
                ident += 1
                start(req, now, ident)
            continue
        req = pending.popleft()
        ident += 1
        if len(running) < CAPACITY and not queue:
            start(req, req.arrival, ident)
        elif len(queue) < QUEUE_LIMIT:
            view = View(model, [req.arrival - s for _, s, _, _ in running],
                        [m for _, _, m, _ in running], len(queue) + 1, history)
            t0 = time.perf_counter()
            predicted = {"ours (ages)": ESTIMATORS["ours (ages)"](view)}
            tally.predict_s += time.perf_counter() - t0
            tally.predictions += 1
            predicted.update({k: f(view) for k, f in ESTIMATORS.items() if k not in predicted})
            queue.append((req, req.arrival, predicted))


def record(tally: Tally, predicted: dict[str, float], actual: float) -> None:
    if actual < 0.05:
        return
    for name, p in predicted.items():
        tally.errors[name].append(abs(p - actual) / actual)


def lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


def warm_model(draw: Callable[[], tuple[float, int]]) -> tuple[HoldTimeModel, History]:
    model = HoldTimeModel(initial_s=5.0)  # the default alpha, as router/app.py builds it
    history = History()
    for _ in range(WARMUP):
        hold, tokens = draw()
        model.observe(hold, tokens)
        history.add(hold, tokens)
    return model, history


def ten_users(seed: int, rounds: int) -> Tally:
    """(a) Ten requests at once on three idle slots, holds lognormal around 4 s; repeated,
    the model carrying over from round to round."""
    rng = random.Random(seed)

    def draw() -> tuple[float, int]:
        return lognormal(rng, 4.0, 0.5), 512

    (model, history), tally = warm_model(draw), Tally()
    for _ in range(rounds):
        simulate([Request(0.0, *draw()) for _ in range(10)], model, tally, history)
    return tally


def mixed_load(seed: int, n: int, load: float, speed_change_every: int = 0) -> Tally:
    """(b) Poisson arrivals at `load` x capacity; 70% short chat turns (max_tokens 256,
    ~2 s) and 30% long generations (max_tokens 2048, ~12 s). With `speed_change_every`,
    holds are 2.5x longer in every other block of that many requests (and the load is
    taken against the average speed)."""
    rng = random.Random(seed)
    drawn = [0]

    def draw() -> tuple[float, int]:
        drawn[0] += 1
        slow = speed_change_every > 0 and (drawn[0] // speed_change_every) % 2 == 1
        factor = 2.5 if slow else 1.0
        if rng.random() < 0.7:
            return lognormal(rng, 2.0 * factor, 0.5), 256
        return lognormal(rng, 12.0 * factor, 0.4), 2048

    mean_hold = (0.7 * 2.0 + 0.3 * 12.0) * (1.75 if speed_change_every else 1.0)
    rate = load * CAPACITY / mean_hold
    (model, history), tally, t, requests = warm_model(draw), Tally(), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        requests.append(Request(t, *draw()))
    simulate(requests, model, tally, history)
    return tally


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def report(title: str, tallies: list[Tally]) -> None:
    n = sum(len(t.errors["ours (ages)"]) for t in tallies)
    us = 1e6 * sum(t.predict_s for t in tallies) / max(1, sum(t.predictions for t in tallies))
    print(f"\n{title}\n  {n} tickets over {len(tallies)} seeds; ours took {us:.0f} us/prediction")
    print(f"  {'estimator':<24}{'median':>8}{'p90':>8}   median per seed (min..max)")
    for name in ESTIMATORS:
        pooled = [e for t in tallies for e in t.errors[name]]
        per_seed = [statistics.median(t.errors[name]) for t in tallies]
        print(f"  {name:<24}{statistics.median(pooled):>8.1%}{quantile(pooled, 0.9):>8.1%}"
              f"   {min(per_seed):.1%}..{max(per_seed):.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--reference", action="store_true",
                        help="add the Monte Carlo reference (slow)")
    args = parser.parse_args()
    if args.reference:
        ESTIMATORS["Monte Carlo reference"] = monte_carlo
    seeds = range(args.seeds)
    print(f"pool: {CAPACITY} slots, FIFO queue of {QUEUE_LIMIT}; relative error "
          "|predicted - actual| / actual at enqueue, actual < 0.05 s skipped")
    report(f"(a) ten users, three slots: {args.rounds} bursts of 10, lognormal ~4 s",
           [ten_users(s, args.rounds) for s in seeds])
    report(f"(b) Poisson at 1.5x capacity, {args.requests} requests, short/long mix",
           [mixed_load(s, args.requests, 1.5) for s in seeds])
    report(f"(c) extra: Poisson at 0.9x capacity, {args.requests} requests, same mix",
           [mixed_load(s, args.requests, 0.9) for s in seeds])
    report("(d) extra: as (c), the backend 2.5x slower in every other 500 requests",
           [mixed_load(s, args.requests, 0.9, speed_change_every=500) for s in seeds])


if __name__ == "__main__":
    main()
