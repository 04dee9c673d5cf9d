"""Queue ETA accuracy by scenario: the naive formula, the holding-time forecast and the
progress-aware one, side by side, cold and warm.

A seeded discrete-event simulation of one pool of 3 slots in front of the embedded
config's simulated 70B (0.4 s to the first token, 30 tokens/s per stream, answers of
60..180 tokens cut at their max_tokens: the engine's own timing, no network). At each
ticket's enqueue every estimator predicts its wait from what a gateway would know then;
at its grant the real wait is known. Relative error |predicted - actual| / actual
(waits under 0.05 s skipped), median and p90.

    naive      (position / slots) x the pool's mean holding time (EWMA; initial_hold_s
               cold), as `policies.clock.eta.naive_wait`
    holds      the forecast before progress: `policies.clock.eta.predict_wait` on the pool's
               `HoldTimeModel` and the running leases' ages
    progress   `policies.clock.forecast.line_starts`, as the pools call it: each running
               answer's tokens streamed and max_tokens, each waiter's max_tokens, the
               backend's `AnswerModel` (until its rates are known: as `holds`)

Cold: the models start from the config (initial_hold_s 10 s; the simulated engine's
parameters as hints). Warm: they have seen 64 answers of the scenario's mix first. Cold,
no hints: as a `url:` backend without `rates` (the progress forecast falls back on
holding times until the first answer is measured).

    .venv/bin/python bench/eta_scenarios.py [--seeds 40]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from policies.clock.answers import AnswerModel, hints
from policies.clock.clock import Answered, Clock
from policies.clock.eta import naive_wait, predict_wait
from policies.clock.forecast import Running, line_starts
from policies.clock.holds import HoldTimeModel
from policies.config import BackendConfig, SimulatedSpec

SLOTS = 3
QUEUE_LIMIT = 10
SPEC = SimulatedSpec(max_num_seqs=SLOTS, ttft_s=0.4, tokens_per_s=30, output_tokens=120,
                     output_tokens_spread=0.5)
CONFIG = BackendConfig(simulated=SPEC, model="m", slots=SLOTS, queue_limit=QUEUE_LIMIT)
WARMUP = 64
ESTIMATORS = ("naive", "holds", "progress")


@dataclass(frozen=True, slots=True)
class Request:
    arrival: float
    max_tokens: int
    tokens: int  # what the engine will produce (its length cut at max_tokens)

    @property
    def hold_s(self) -> float:
        return SPEC.ttft_s + (self.tokens - 1) / SPEC.tokens_per_s


@dataclass
class Models:
    """The backend's clock, as the gateway's: one observation per finished answer."""

    clock: Clock = field(default_factory=lambda: Clock(CONFIG.initial_hold_s, hints(CONFIG)))

    @property
    def holds(self) -> HoldTimeModel:
        return self.clock.holds

    @property
    def answers(self) -> AnswerModel:
        return self.clock.answers

    def learn(self, req: Request) -> None:
        self.clock.observe(Answered(req.hold_s, req.max_tokens, req.tokens,
                                    ttft_s=SPEC.ttft_s, whole=True))


def draw(rng: random.Random, arrival: float, max_tokens: int) -> Request:
    spread = SPEC.output_tokens * SPEC.output_tokens_spread
    length = max(1, round(rng.uniform(SPEC.output_tokens - spread, SPEC.output_tokens + spread)))
    return Request(arrival, max_tokens, min(length, max_tokens))


def tokens_at(req: Request, elapsed: float) -> int:
    """What the relay has counted of `req`'s stream after `elapsed` seconds."""
    if elapsed < SPEC.ttft_s:
        return 0
    return min(req.tokens, 1 + int((elapsed - SPEC.ttft_s) * SPEC.tokens_per_s))


def predict(models: Models, now: float, running: list[tuple[float, float, int, Request]],
            waiting: list[Request], position: int) -> dict[str, float]:
    ages = [now - start for _, start, _, _ in running]
    progress = [Running(now - start, tokens_at(req, now - start), req.max_tokens)
                for _, start, _, req in running]
    starts = line_starts(models.answers, models.holds, progress, SLOTS,
                         [w.max_tokens for w in waiting], position)
    return {
        "naive": naive_wait(models.holds.mean_s, SLOTS, position),
        "holds": predict_wait(models.holds, ages, SLOTS, position),
        "progress": starts[position - 1],
    }


def simulate(requests: list[Request], models: Models, errors: dict[str, list[float]]) -> None:
    """FIFO pool: departures before arrivals at equal times; a full queue drops arrivals."""
    running: list[tuple[float, float, int, Request]] = []  # (end, start, seq, request)
    queue: deque[tuple[Request, dict[str, float]]] = deque()
    pending = deque(sorted(requests, key=lambda r: r.arrival))
    seq = 0
    while pending or running:
        seq += 1
        if running and (not pending or running[0][0] <= pending[0].arrival):
            now, _, _, done = heapq.heappop(running)
            models.learn(done)
            if queue:
                req, predicted = queue.popleft()
                actual = now - req.arrival
                if actual >= 0.05:
                    for name, p in predicted.items():
                        errors[name].append(abs(p - actual) / actual)
                heapq.heappush(running, (now + req.hold_s, now, seq, req))
            continue
        req = pending.popleft()
        if len(running) < SLOTS and not queue:
            heapq.heappush(running, (req.arrival + req.hold_s, req.arrival, seq, req))
        elif len(queue) < QUEUE_LIMIT:
            ahead = [r for r, _ in queue]
            queue.append((req, predict(models, req.arrival, running, [*ahead, req],
                                       len(queue) + 1)))


Scenario = Callable[[random.Random, float], list[Request]]


def burst_80(rng: random.Random, t0: float) -> list[Request]:
    """(a) ten streams at once, max_tokens 80."""
    return [draw(rng, t0, 80) for _ in range(10)]


def burst_mixed(rng: random.Random, t0: float) -> list[Request]:
    """(b) ten streams at once, max_tokens 40..120."""
    return [draw(rng, t0, rng.randint(40, 120)) for _ in range(10)]


POISSON_TOKENS = (64, 128, 256)


def mean_hold() -> float:
    rng = random.Random(0)
    return statistics.fmean(draw(rng, 0, rng.choice(POISSON_TOKENS)).hold_s
                            for _ in range(20_000))


def poisson(n: int) -> Scenario:
    """(c) Poisson arrivals at 1.5x capacity, max_tokens 64/128/256."""
    rate = 1.5 * SLOTS / mean_hold()

    def make(rng: random.Random, t0: float) -> list[Request]:
        t, out = t0, []
        for _ in range(n):
            t += rng.expovariate(rate)
            out.append(draw(rng, t, rng.choice(POISSON_TOKENS)))
        return out

    return make


def run(scenario: Scenario, seeds: int, rounds: int, start: str) -> dict[str, list[float]]:
    errors: dict[str, list[float]] = {name: [] for name in ESTIMATORS}
    warm = start == "warm"
    for seed in range(seeds):
        rng = random.Random(seed)
        models = Models() if start != "cold, no hints" else Models(Clock(CONFIG.initial_hold_s))
        if warm:
            for req in sorted(scenario(rng, 0.0) * 8, key=lambda r: r.arrival)[:WARMUP]:
                models.learn(req)
        for r in range(rounds):
            simulate(scenario(rng, 1000.0 * (r + 1)), models, errors)
    return errors


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40)
    args = parser.parse_args()
    cases: list[tuple[str, Scenario, int, int]] = [
        ("(a) burst: 10 at 3 slots, max_tokens 80", burst_80, 1, 5),
        ("(b) burst: 10 at 3 slots, max_tokens 40-120", burst_mixed, 1, 5),
        ("(c) Poisson at 1.5x capacity, max_tokens 64/128/256", poisson(60), 1, 1),
    ]
    print(f"pool: {SLOTS} slots, queue {QUEUE_LIMIT}; engine: {SPEC.ttft_s} s TTFT, "
          f"{SPEC.tokens_per_s:g} tokens/s, answers {SPEC.output_tokens} +/- "
          f"{SPEC.output_tokens_spread:.0%}; {args.seeds} seeds")
    print(f"| scenario | start | tickets | {' | '.join(f'{e} median / p90' for e in ESTIMATORS)} |")
    print("|---|---|---|" + "---|" * len(ESTIMATORS))
    for title, scenario, cold_rounds, warm_rounds in cases:
        for start, rounds in (("cold", cold_rounds), ("warm", warm_rounds),
                              ("cold, no hints", cold_rounds)):
            errors = run(scenario, args.seeds, rounds, start)
            cells = [f"{statistics.median(errors[e]):.1%} / {quantile(errors[e], 0.9):.0%}"
                     for e in ESTIMATORS]
            print(f"| {title} | {start} | {len(errors['progress'])} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
