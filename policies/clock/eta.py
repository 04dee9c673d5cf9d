"""Holding-time queue ETAs, the naive wait and the Retry-After a forecast implies.

Pure: the caller owns the clock and passes hold times and lease ages in; no I/O.
`predict_wait` combines a pool's `HoldTimeModel` (policies.clock.holds: how long a slot is held)
with the ages of the running leases to say when the ticket at a queue position gets a slot.
The pools forecast from the answers' progress (`policies.clock.forecast`); this one stands in
until a backend's rates are known, and bench/eta_scenarios.py compares the two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from policies.clock.holds import HoldDistribution, HoldTimeModel

TARGET_OFFSET = 0.5  # solve for k - 1/2 expected departures (~ the median k-th departure)
TOLERANCE = 1e-3  # relative precision of a predicted wait
DEPARTURES_TOLERANCE = 0.01  # ... or this close to the target number of departures
EXACT_EXTRA = 16  # departures modelled exactly: at most capacity + min(capacity, this)
MAX_RENEWALS = 64  # holds summed per slot, at most, in one evaluation


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


def naive_wait(mean_hold_s: float, capacity: int, position: int) -> float:
    """(position / capacity) * mean hold: a slot frees every mean / capacity seconds. The
    baseline the benches hold the forecast against (bench/eta_scenarios.py)."""
    return position * mean_hold_s / capacity
