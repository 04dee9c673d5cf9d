"""How long a slot is held: learned per pool from the holds it saw. Pure, no I/O.

`HoldTimeModel` keeps a window of recent holds per pool (and per max_tokens bucket), turns
it into a distribution with a Pareto tail past the data, and gives the `Residual` of a
running lease: what is left of it, given its age. `policies.clock.eta` combines these into
queue waits.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

WINDOW = 128  # recent holds kept per pool (and per max_tokens bucket)
MIN_EMPIRICAL = 4  # fewer samples: a Pareto-tailed guess around the running mean
MIN_BUCKET = 8  # fewer samples in a max_tokens bucket: use the pool-wide distribution
SHIFT_MIN = 16  # window size from which level shifts are detected
SHIFT_RUN = 5  # this many holds in a row beyond the window's 10%/90% quantile = new speed
TAIL_XI = 0.2  # shape of the Pareto tail past the data: a lease running 4x longer than
#                anything seen is expected to need ~1/4 of its age more, not a fixed bit
FLOOR_FRACTION = 0.05  # an overdue lease still needs at least this fraction of a mean hold
_TAIL_X2 = 2 * (1 - TAIL_XI) / (1 - 2 * TAIL_XI)  # E[X^2] / e^2 of the tail's excess X


# Not frozen, though never changed once made: made for every request that waits, and a
# frozen dataclass sets each field through object.__setattr__ (policies/scheduler/decision.py).
@dataclass(slots=True)
class Residual:
    """What is left of one running lease: mean, variance and CDF of its remaining time."""

    shape: HoldDistribution
    age_s: float
    survival: float  # P(hold > age); 0: overdue past every known hold
    mean_s: float
    var_s2: float
    in_tail: bool = False  # past the data: a Pareto remainder with mean `mean_s`

    def cdf(self, t: float) -> float:
        if t < 0:
            return 0.0
        if self.in_tail:
            scale = self.mean_s * (1 - TAIL_XI)
            return 1.0 - math.pow(1.0 + TAIL_XI * t / scale, -1.0 / TAIL_XI)
        if self.survival <= 0.0:
            return 1.0 if t >= self.mean_s else 0.0
        return max(0.0, 1.0 - self.shape.survival(self.age_s + t) / self.survival)


@dataclass(slots=True)
class HoldDistribution:
    """Hold times: the recent samples, the top few replaced by a Pareto tail. Read-only.

    The tail starts at `u`, the largest body sample, with the mean excess `e` of the
    samples it replaces, so the mean is kept and a lease that outlives every sample
    still has a positive remainder that grows with its age. Without samples it is all
    tail (u = 0, e = the guessed mean): a wide prior.
    """

    body: list[float]  # sorted
    sx: list[float]  # suffix sums: sx[i] = sum(body[i:])
    sx2: list[float]  # suffix sums of squares
    w: float  # probability mass of one body sample
    tail: float  # probability mass of the tail
    u: float
    e: float
    mean_s: float
    var_s2: float

    @classmethod
    def from_samples(cls, xs: Sequence[float]) -> HoldDistribution:  # xs sorted, len >= 2
        n = len(xs)
        nt = min(8, max(1, n // 8))
        body = list(xs[: n - nt])
        u = body[-1]
        e = max(0.0, sum(xs[n - nt :]) / nt - u)
        sx, sx2 = [0.0] * (len(body) + 1), [0.0] * (len(body) + 1)
        for i in range(len(body) - 1, -1, -1):
            sx[i] = sx[i + 1] + body[i]
            sx2[i] = sx2[i + 1] + body[i] * body[i]
        return cls._make(body, sx, sx2, 1.0 / n, nt / n, u, e)

    @classmethod
    def tail_only(cls, mean_s: float) -> HoldDistribution:
        return cls._make([], [0.0], [0.0], 0.0, 1.0, 0.0, max(mean_s, 0.0))

    @classmethod
    def _make(cls, body: list[float], sx: list[float], sx2: list[float], w: float,
              tail: float, u: float, e: float) -> HoldDistribution:
        mean = w * sx[0] + tail * (u + e)
        second = w * sx2[0] + tail * (u * u + 2 * u * e + _TAIL_X2 * e * e)
        return cls(body, sx, sx2, w, tail, u, e, mean, max(0.0, second - mean * mean))

    def survival(self, y: float) -> float:
        """P(hold > y), each body sample's mass spread evenly down to the one below it:
        continuous, so the departures curve has no steps for the solver to chase."""
        body = self.body
        i = bisect_right(body, y)
        s = (len(body) - i) * self.w
        if 0 < i < len(body) and body[i] > body[i - 1]:
            s -= self.w * (y - body[i - 1]) / (body[i] - body[i - 1])
        if y < self.u:
            return s + self.tail
        if self.e > 0:
            scale = self.e * (1 - TAIL_XI)
            return s + self.tail * math.pow(1.0 + TAIL_XI * (y - self.u) / scale, -1.0 / TAIL_XI)
        return s

    def residual(self, age_s: float) -> Residual:
        a = max(0.0, age_s)
        floor = max(1e-3, FLOOR_FRACTION * self.mean_s)
        if a >= self.u and self.e > 0:  # Pareto: the mean excess grows by xi/(1-xi) per s
            mean = max(floor, self.e + TAIL_XI * (a - self.u) / (1 - TAIL_XI))
            var = mean * mean * (_TAIL_X2 - 1)
            return Residual(self, a, self.survival(a), mean, var, in_tail=True)
        i = bisect_right(self.body, a)
        cnt = len(self.body) - i
        s = cnt * self.w
        m1 = (self.sx[i] - a * cnt) * self.w
        m2 = (self.sx2[i] - 2 * a * self.sx[i] + a * a * cnt) * self.w
        if a < self.u:
            d, e = self.u - a, self.e
            s += self.tail
            m1 += self.tail * (d + e)
            m2 += self.tail * (d * d + 2 * d * e + _TAIL_X2 * e * e)
        if s <= 0.0:
            return Residual(self, a, 0.0, floor, 0.0)
        mean = m1 / s
        var = max(0.0, m2 / s - mean * mean)
        return Residual(self, a, self.survival(a), max(mean, floor), var)


class _Window:
    """The last holds, in arrival order and sorted, with level-shift detection."""

    __slots__ = ("_shape", "above", "below", "recent", "sorted")

    def __init__(self, size: int) -> None:
        self.recent: deque[float] = deque(maxlen=size)
        self.sorted: list[float] = []
        self.above = self.below = 0
        self._shape: HoldDistribution | None = None

    def add(self, x: float) -> list[float] | None:
        """Record `x`; returns the run of new-speed holds when a level shift is detected."""
        n = len(self.sorted)
        if n >= SHIFT_MIN:
            self.above = self.above + 1 if x > self.sorted[(9 * n) // 10] else 0
            self.below = self.below + 1 if x < self.sorted[n // 10] else 0
        if len(self.recent) == self.recent.maxlen:
            del self.sorted[bisect_left(self.sorted, self.recent[0])]
        self.recent.append(x)
        insort(self.sorted, x)
        self._shape = None
        if max(self.above, self.below) < SHIFT_RUN:
            return None
        # Under a steady speed such a run has odds of 1e-5: the older holds are history.
        run = list(self.recent)[-SHIFT_RUN:]
        self.recent.clear()
        self.recent.extend(run)
        self.sorted = sorted(run)
        self.above = self.below = 0
        return run

    def shape(self) -> HoldDistribution:
        if self._shape is None:
            self._shape = HoldDistribution.from_samples(self.sorted)
        return self._shape


def _bucket(max_tokens: int | None) -> int | None:
    return max_tokens.bit_length() if max_tokens is not None and max_tokens > 0 else None


class HoldTimeModel:
    """How long a slot of one pool is held, learned online.

    `mean_s` is an exponentially weighted mean (the first measurement replaces the
    configured guess; a detected change of speed resets it to the new level). The
    distribution behind `expected_remaining` and `predict_wait` is the last `window`
    holds, also kept per power-of-two bucket of the request's max_tokens when given.
    """

    __slots__ = ("_buckets", "_window", "alpha", "mean_s", "samples", "window")

    def __init__(self, initial_s: float, alpha: float = 0.2, window: int = WINDOW) -> None:
        if window < MIN_BUCKET:
            raise ValueError(f"window must be >= {MIN_BUCKET}")
        self.mean_s = initial_s
        self.alpha = alpha
        self.samples = 0
        self.window = window
        self._window = _Window(window)
        self._buckets: dict[int, _Window] = {}

    def observe(self, held_s: float, max_tokens: int | None = None) -> None:
        if not 0 <= held_s < math.inf:  # clock oddities (and NaN) are ignored
            return
        if self.samples == 0:
            self.mean_s = held_s  # the first real measurement beats the configured guess
        else:
            self.mean_s += self.alpha * (held_s - self.mean_s)
        self.samples += 1
        run = self._window.add(held_s)
        if run is not None:
            self.mean_s = sum(run) / len(run)
        key = _bucket(max_tokens)
        if key is not None:
            self._buckets.setdefault(key, _Window(self.window)).add(held_s)

    def distribution(self, max_tokens: int | None = None) -> HoldDistribution:
        """The hold distribution predictions use: of the max_tokens bucket, or pool-wide."""
        key = _bucket(max_tokens)
        bucket = self._buckets.get(key) if key is not None else None
        if bucket is not None and len(bucket.sorted) >= MIN_BUCKET:
            return bucket.shape()
        if len(self._window.sorted) >= MIN_EMPIRICAL:
            return self._window.shape()
        return HoldDistribution.tail_only(self.mean_s)

    def residual(self, age_s: float, max_tokens: int | None = None) -> Residual:
        return self.distribution(max_tokens).residual(age_s)

    def expected_remaining(self, age_s: float, max_tokens: int | None = None) -> float:
        """E[hold - age | hold > age]: always > 0; age + it never decreases with age."""
        return self.residual(age_s, max_tokens).mean_s
