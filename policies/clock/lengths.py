"""How many tokens a backend's answers run to: learned from finished answers. Pure, no I/O.

An answer cut by its `max_tokens` (or by its client) says only that its natural length
was at least what it produced: such samples are censored, and the distribution is the
Kaplan-Meier estimate over a window of recent answers, so that answers capped at 80
tokens do not teach that a request allowed 120 stops at 80. Past the longest length seen,
an exponential tail whose mean excess grows with the length reached (a quarter of it).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

WINDOW = 256  # recent answers kept
# An answer's length when nothing is known of it (no max_tokens, no answer of its backend
# measured or hinted): the one prior of every estimate that needs one (the context-window
# fit, a fair line's charge, an option's cost, a replica's load).
OUTPUT_PRIOR = 256
TAIL_FRACTION = 0.25  # past the data, an answer at n tokens runs ~n/4 more (mean excess)


@dataclass(frozen=True, slots=True)
class Survival:
    """P(length > x) as a step function: `after[j]` holds on [points[j], points[j+1])."""

    points: tuple[float, ...]  # distinct lengths at which answers ended, ascending
    after: tuple[float, ...]  # P(length > points[j])

    def above(self, x: float) -> float:
        """P(length > x)."""
        s = 1.0
        for point, after in zip(self.points, self.after, strict=True):
            if point > x:
                break
            s = after
        return s

    def remaining(self, produced: float, cap: float | None) -> float | None:
        """E[min(L, cap) - produced | L >= produced]: the tokens still to come of an answer
        that has produced `produced` (0 for a fresh one) and may run to `cap`. None: not
        known (no sample, and no cap to run to)."""
        n = max(0.0, produced)
        if cap is not None and n >= cap:
            return 0.0
        if not self.points:
            return None if cap is None else cap - n
        # P(L >= n): the survival just before n (lengths are whole tokens)
        s_n = self.above(n - 1e-9) if n > 0 else 1.0
        last = self.points[-1]
        if n > last or s_n <= 0.0:  # outlived every answer seen: the growing tail
            return _tail(max(n, last), max(0.0, (cap or math.inf) - n))
        total, x, s = 0.0, n, s_n
        for point, after in zip(self.points, self.after, strict=True):
            if point <= n:  # P(L > n) on [n, the next point)
                s = after
                continue
            end = min(point, cap) if cap is not None else point
            total += s * (end - x)  # P(L > y) = s on [x, point)
            x = end
            if cap is not None and x >= cap:
                return total / s_n
            s = after
        if s > 0:  # mass past the last point (a censored longest answer)
            total += s * _tail(last, (cap - x) if cap is not None else math.inf)
        return total / s_n


def _tail(at: float, span: float) -> float:
    """Expected tokens in `span` past `at` under an exponential with mean TAIL_FRACTION*at."""
    mean = max(1.0, TAIL_FRACTION * at)
    if math.isinf(span):
        return mean
    return mean * -math.expm1(-span / mean)


def kaplan_meier(samples: Iterable[tuple[int, bool]]) -> Survival:
    """The survival of lengths from (tokens, censored) samples; a censored one ran at
    least `tokens`."""
    ordered = sorted(samples)
    at_risk = len(ordered)
    points: list[float] = []
    after: list[float] = []
    s, i = 1.0, 0
    while i < len(ordered):
        length = ordered[i][0]
        ended = leaving = 0
        while i < len(ordered) and ordered[i][0] == length:
            ended += not ordered[i][1]
            leaving += 1
            i += 1
        if ended:
            s *= 1.0 - ended / at_risk
            points.append(float(length))
            after.append(s)
        at_risk -= leaving
    if ordered and (not points or points[-1] < ordered[-1][0]) and s > 0:
        # the longest answers were all cut: their lengths bound the known part
        points.append(float(ordered[-1][0]))
        after.append(s)
    return Survival(tuple(points), tuple(after))


def uniform(mean: int, spread: float, steps: int = 32) -> Survival:
    """A prior: lengths uniform within +/- `spread` x `mean` (a point mass when 0)."""
    lo, hi = max(1.0, mean * (1 - spread)), max(1.0, mean * (1 + spread))
    if hi - lo < 1:
        return Survival((float(mean),), (0.0,))
    points = tuple(lo + (hi - lo) * j / steps for j in range(steps + 1))
    return Survival(points, tuple(1.0 - j / steps for j in range(steps + 1)))


class LengthWindow:
    """The last `size` answers' lengths, censored or not; its survival made on demand."""

    __slots__ = ("_survival", "added", "samples")

    def __init__(self, size: int = WINDOW) -> None:
        self.samples: deque[tuple[int, bool]] = deque(maxlen=size)
        self._survival: Survival | None = None
        self.added = 0  # samples ever added (the window's length stops growing)

    def __len__(self) -> int:
        return len(self.samples)

    def add(self, tokens: int, censored: bool) -> None:
        if tokens < 0:
            return
        self.samples.append((tokens, censored))
        self.added += 1
        self._survival = None

    def survival(self) -> Survival:
        if self._survival is None:
            self._survival = kaplan_meier(self.samples)
        return self._survival
