"""When each place in a pool's line gets a slot, from what the running answers have
produced. Pure: the caller owns the clock and passes elapsed times in; no I/O.

Each running answer frees its slot after its expected remainder (`AnswerModel`: given
its tokens so far and its max_tokens; given its age alone where its progress is not seen
here). The k-th slot to free serves place k, which then holds it for its own expected
answer (its max_tokens), and so on: a small event simulation, exact for bursts. Until
the engine's rates are known (a hint, or a first measured stream), the holding-time
forecast (`policies.clock.eta`) stands in for the whole line; where the answer model cannot
tell one duration (no length to run to), the holding times stand in for it.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from policies.clock.answers import AnswerModel, Rates
from policies.clock.eta import predict_waits
from policies.clock.holds import HoldTimeModel

EXACT_PLACES = 512  # places simulated one by one; later ones follow at the pool's rate


class Produced(Protocol):
    """A stream's relay counter: one per data event relayed (router.common.usage.Usage is one)."""

    @property
    def seen_events(self) -> int: ...


# Not frozen, though never changed once made: made for every request that waits, and a
# frozen dataclass sets each field through object.__setattr__ (policies/scheduler/decision.py).
@dataclass(slots=True)
class Running:
    """One running answer as the forecast sees it."""

    elapsed_s: float
    tokens: int | None = None  # streamed so far; None: not counted here
    max_tokens: int | None = None


@dataclass(slots=True)
class Progress:
    """What a lease's holder tells of its answer: its cap and, for a stream, the relay's
    counter (read only when a forecast is made: the relay just increments it)."""

    max_tokens: int | None = None
    produced: Produced | None = None

    def running(self, elapsed_s: float) -> Running:
        tokens = self.produced.seen_events if self.produced is not None else None
        return Running(elapsed_s, tokens, self.max_tokens)


def seen_here(ages_s: Sequence[float], mine: Sequence[tuple[float, Progress]],
              held: int = 0) -> list[Running]:
    """A shared pool's running answers: those held in this process (age, progress) with
    their progress, each in place of the age nearest its own among all the leases' ages
    (as the store last said); every other one by its age alone; and, up to `held` (the
    store's latest count), leases of unknown age, taken as just begun."""
    others = sorted(ages_s)
    running: list[Running] = []
    for age, progress in mine:
        if others:
            nearest = min(range(len(others)), key=lambda i: abs(others[i] - age))
            del others[nearest]
        running.append(progress.running(age))
    running += [Running(age) for age in others]
    running += [Running(0.0)] * (held - len(running))
    return running


class Durations:
    """A pool's expected remainders and fresh holds, for one forecast (fresh holds
    computed once per max_tokens); `rates`: one replica's own, in place of the pool's."""

    __slots__ = ("_fresh", "answers", "holds", "rates")

    def __init__(self, answers: AnswerModel, holds: HoldTimeModel,
                 rates: Rates | None = None) -> None:
        self.answers, self.holds, self.rates = answers, holds, rates
        self._fresh: dict[int | None, float] = {}

    def remaining(self, run: Running) -> float:
        got = self.answers.remaining_s(max(0.0, run.elapsed_s), run.tokens, run.max_tokens,
                                       self.rates)
        if got is None:
            return self.holds.expected_remaining(run.elapsed_s)
        return got

    def fresh(self, max_tokens: int | None) -> float:
        hold = self._fresh.get(max_tokens)
        if hold is None:
            got = self.answers.fresh_s(max_tokens, self.rates)
            hold = self.holds.distribution().mean_s if got is None else got
            self._fresh[max_tokens] = hold
        return hold


def line_starts(answers: AnswerModel, holds: HoldTimeModel, running: Sequence[Running],
                capacity: int, waiting: Sequence[int | None], places: int,
                rates: Rates | None = None) -> list[float]:
    """Seconds until places 1..`places` get a slot: `start_times` once the engine's rates
    are known (`rates`: one replica's own, for the line of that replica alone; the
    answers' lengths stay the backend's), else the holding-time forecast from the running
    answers' ages."""
    if rates is None and not answers.known:
        return predict_waits(holds, [max(0.0, run.elapsed_s) for run in running],
                             max(1, capacity), places)
    return start_times(Durations(answers, holds, rates), running, capacity, waiting, places)


def start_times(durations: Durations, running: Sequence[Running], capacity: int,
                waiting: Sequence[int | None], places: int) -> list[float]:
    """Seconds until places 1..`places` get a slot. `waiting[i]`: the max_tokens of the
    waiter at place i + 1, as far as known (places past it: None, the typical answer).
    More running answers than `capacity` (after a cut): the extra ones free no slot."""
    capacity = max(1, capacity)
    ends = [durations.remaining(run) for run in running]
    heapq.heapify(ends)
    free = capacity - len(ends)
    excess = max(0, -free)
    starts: list[float] = []
    for place in range(min(places, EXACT_PLACES)):
        if free > 0:
            free -= 1
            start = 0.0
        else:
            start = heapq.heappop(ends)
            while excess:
                excess -= 1
                start = heapq.heappop(ends)
        starts.append(start)
        heapq.heappush(ends, start + durations.fresh(
            waiting[place] if place < len(waiting) else None))
    if places > EXACT_PLACES:
        step = durations.fresh(None) / capacity
        last = starts[-1]
        starts += [last + step * (k + 1) for k in range(places - EXACT_PLACES)]
    return starts
