"""Service-time estimates, per-position queue ETAs and the Retry-After they imply.

Pure: the caller owns the clock and passes hold times and lease ages in; no I/O.
`HoldTimeModel` learns per pool how long a slot is held; `predict_wait` combines it with
the ages of the running leases to say when the ticket at a queue position gets a slot.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

WINDOW = 128  # recent holds kept per pool (and per max_tokens bucket)
MIN_EMPIRICAL = 4  # fewer samples: a Pareto-tailed guess around the running mean
MIN_BUCKET = 8  # fewer samples in a max_tokens bucket: use the pool-wide distribution
SHIFT_MIN = 16  # window size from which level shifts are detected
SHIFT_RUN = 5  # this many holds in a row beyond the window's 10%/90% quantile = new speed
TAIL_XI = 0.2  # shape of the Pareto tail past the data: a lease running 4x longer than
#                anything seen is expected to need ~1/4 of its age more, not a fixed bit
FLOOR_FRACTION = 0.05  # an overdue lease still needs at least this fraction of a mean hold
TARGET_OFFSET = 0.5  # solve for k - 1/2 expected departures (~ the median k-th departure)
TOLERANCE = 1e-3  # relative precision of a predicted wait
DEPARTURES_TOLERANCE = 0.01  # ... or this close to the target number of departures
EXACT_EXTRA = 16  # departures modelled exactly: at most capacity + min(capacity, this)
MAX_RENEWALS = 64  # holds summed per slot, at most, in one evaluation
_TAIL_X2 = 2 * (1 - TAIL_XI) / (1 - 2 * TAIL_XI)  # E[X^2] / e^2 of the tail's excess X


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class WaitForecast:
    wait_s: float
    exact_departures: int  # departures solved from the distribution; later ones at c/mean
    terms: int  # CDF terms evaluated: the work done, bounded whatever the position


class _Drain:
    """The queue draining through the slots, as described in `forecast_wait`."""

    def __init__(self, model: HoldTimeModel, active_ages_s: Sequence[float], capacity: int,
                 active_max_tokens: Sequence[int | None] | None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        tokens = active_max_tokens or [None] * len(active_ages_s)
        self.leases = [model.residual(a, m) for a, m in zip(active_ages_s, tokens, strict=True)]
        self.capacity = capacity
        self.free = capacity - len(self.leases)  # < 0 after a capacity cut: extras leave first
        fresh = model.distribution()
        self.hold = fresh.mean_s
        self.renewals = [_Renewals(r.mean_s, r.var_s2, fresh) for r in self.leases]
        self.renewals += [_Renewals(0.0, 0.0, fresh) for _ in range(self.free)]
        self.exact_cap = len(self.renewals) + min(len(self.renewals), EXACT_EXTRA)
        self.exact = 0
        self.terms = 0

    def wait(self, position: int, lo: float = 0.0) -> float:
        """Wait at `position`; `lo` is a known lower bound (the previous position's wait)."""
        k = position - self.free
        if k <= 0:
            return 0.0
        if k > self.exact_cap:
            extra = k - self.exact_cap
            return self.wait(position - extra, lo) + extra * self.hold / self.capacity
        self.exact = max(self.exact, k)
        return self._solve(k - TARGET_OFFSET, lo)

    def _solve(self, target: float, lo: float) -> float:
        """The t with N(t) = target: bracketed false position (Illinois), bisecting when
        it stalls, so that a step-shaped N (equal holds) converges too. Done when N is
        within 0.01 departures of the target or t within TOLERANCE."""
        g_lo = self._departures(lo) - target if lo > 0 else -target
        if g_lo >= 0:
            return lo
        hi = lo + (1.0 / self.capacity + 1.0) * max(self.hold, 1e-9)
        g_hi = self._departures(hi) - target
        while g_hi < 0 and hi < 1e12:
            lo, g_lo, hi = hi, g_hi, 2 * hi
            g_hi = self._departures(hi) - target
        side = 0
        for step in range(200):
            if hi - lo <= TOLERANCE * hi or g_hi <= DEPARTURES_TOLERANCE:
                break
            if step % 3 == 2:
                mid = (lo + hi) / 2
            else:
                mid = hi - g_hi * (hi - lo) / (g_hi - g_lo)
                mid = min(max(mid, lo + 1e-3 * (hi - lo)), hi - 1e-3 * (hi - lo))
            g = self._departures(mid) - target
            if g >= 0:
                hi, g_hi = mid, g
                g_lo = g_lo / 2 if side == 1 else g_lo
                side = 1
            elif g >= -DEPARTURES_TOLERANCE:
                return mid
            else:
                lo, g_lo = mid, g
                g_hi = g_hi / 2 if side == -1 else g_hi
                side = -1
        return hi

    def _departures(self, t: float) -> float:
        """N(t): the expected number of slots freed within t."""
        total = 0.0
        for r in self.leases:
            total += r.cdf(t)
        self.terms += len(self.leases)
        log_t = math.log(t) if t > 0 else -math.inf
        for ren in self.renewals:
            done, used = ren.count(log_t)
            total += done
            self.terms += used
        return total


class _Renewals:
    """P(R + H_1 + ... + H_j <= t) for j = 1, 2, ...: lognormals matched lazily, once."""

    __slots__ = ("hold", "hold_var", "mean", "mus", "scales", "var")

    def __init__(self, mean: float, var: float, fresh: HoldDistribution) -> None:
        self.mean, self.var = mean, var
        self.hold, self.hold_var = max(fresh.mean_s, 1e-12), fresh.var_s2
        self.mus: list[float] = []  # of log(R + H_1 + ... + H_j), j = len + 1
        self.scales: list[float] = []  # its sigma * sqrt(2)

    def count(self, log_t: float) -> tuple[float, int]:
        """Expected renewals done by t (a term below 1e-5 ends the sum); terms used."""
        mus, scales, total = self.mus, self.scales, 0.0
        for j in range(MAX_RENEWALS):
            if j == len(mus):
                mean = self.mean + (j + 1) * self.hold
                s2 = math.log1p((self.var + (j + 1) * self.hold_var) / (mean * mean))
                mus.append(math.log(mean) - s2 / 2)
                scales.append(math.sqrt(2 * s2))
            if scales[j] > 0.0:
                p = 0.5 * math.erfc((mus[j] - log_t) / scales[j])
            else:
                p = 1.0 if log_t >= mus[j] - 1e-12 else 0.0
            total += p
            if p < 1e-5:
                return total, j + 1
        return total, MAX_RENEWALS


def forecast_wait(
    model: HoldTimeModel,
    active_ages_s: Sequence[float],
    capacity: int,
    position: int,
    *,
    active_max_tokens: Sequence[int | None] | None = None,
) -> WaitForecast:
    """When the ticket at `position` (1 = next) gets a slot, with the work it took.

    It gets the k-th slot to free (k = position minus free slots). Each running lease
    (of age a_i, optionally with its max_tokens) frees after its remainder R_i given its
    age; each freed slot starts a waiter on a fresh hold H. The expected number of
    departures by t,
        N(t) = sum_i P(R_i <= t) + sum_i sum_j P(R_i + H_1 + ... + H_j <= t)
    (sums of holds as moment-matched lognormals), is solved for N(t) = k - 1/2. With
    three fresh slots, k = 1 lands near the median of the shortest hold; for large k it
    is the familiar k * mean / c. Only the first c + min(c, 16) departures are solved;
    later ones follow at the long-run rate c / mean hold.
    """
    drain = _Drain(model, active_ages_s, capacity, active_max_tokens)
    wait = drain.wait(position) if position >= 1 else 0.0
    return WaitForecast(wait, drain.exact, drain.terms)


def predict_wait(
    model: HoldTimeModel,
    active_ages_s: Sequence[float],
    capacity: int,
    position: int,
    *,
    active_max_tokens: Sequence[int | None] | None = None,
) -> float:
    """Seconds until the ticket at `position` (1 = next) gets a slot; see `forecast_wait`."""
    return forecast_wait(
        model, active_ages_s, capacity, position, active_max_tokens=active_max_tokens
    ).wait_s


def predict_waits(
    model: HoldTimeModel,
    active_ages_s: Sequence[float],
    capacity: int,
    positions: int,
    *,
    active_max_tokens: Sequence[int | None] | None = None,
) -> list[float]:
    """`predict_wait` for positions 1..`positions` at once (a queue page refresh):
    one model of the slots, each solve starting from the previous position's wait."""
    drain = _Drain(model, active_ages_s, capacity, active_max_tokens)
    waits: list[float] = []
    for position in range(1, positions + 1):
        if position - drain.free > drain.exact_cap:
            waits.append(waits[-1] + drain.hold / capacity)
        else:
            waits.append(drain.wait(position, waits[-1] if waits else 0.0))
    return waits


class PoolLoad(Protocol):
    """What the snapshot helpers read of a pool (`policies.slots.PoolSnapshot` is one):
    declared here so that the forecast imports nothing of the pools that use it."""

    @property
    def capacity(self) -> int: ...

    @property
    def mean_hold_s(self) -> float: ...


def naive_wait(mean_hold_s: float, capacity: int, position: int) -> float:
    """(position / capacity) * mean hold: a slot frees every mean / capacity seconds."""
    return position * mean_hold_s / capacity


def advised_retry_s(forecasts_s: Iterable[float], floor_s: int, cap_s: int) -> int:
    """The Retry-After a refused request is given: whole seconds (>= floor_s >= 1, <= cap_s)
    until the soonest of `forecasts_s` (each a full pool's forecast of its next free slot,
    which also frees a place in its queue)."""
    soonest = min(forecasts_s, default=float(floor_s))
    return max(floor_s, min(cap_s, math.ceil(soonest)))


def queue_wait_s(pool: PoolLoad, position: int) -> float:
    """Naive expected wait of the ticket at `position` (1 = next) in a saturated pool."""
    return naive_wait(pool.mean_hold_s, pool.capacity, position)
