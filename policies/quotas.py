"""Per-key limits: how many requests a key may run at once, and what it may spend per
calendar period (UTC hour, day or month) in tokens or cost.

Pure bookkeeping, no I/O. `admit` checks every limit before the request takes anything
(a slot, a place in a queue); a refused request changes nothing. An admitted request
counts against the concurrency cap until `finish`, which also charges what it actually
used. A budget is checked at admission, so the request that crosses it still completes:
a key overshoots by at most what its requests in flight use.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from policies.admission import RejectReason
from policies.config import ApiKeyConfig, BudgetConfig

Clock = Callable[[], float]  # Unix seconds


def period_bounds(period: str, now: float) -> tuple[float, float]:
    """The start and end (Unix seconds) of the UTC `period` holding `now`."""
    at = datetime.fromtimestamp(now, UTC)
    if period == "hour":
        start = at.replace(minute=0, second=0, microsecond=0)
        end = start + timedelta(hours=1)
    elif period == "day":
        start = at.replace(hour=0, minute=0, second=0, microsecond=0)
        end = start + timedelta(days=1)
    else:
        start = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = (start + timedelta(days=32)).replace(day=1)
    return start.timestamp(), end.timestamp()


@dataclass(slots=True)
class Spend:
    """What a key used in one budget's current period."""

    budget: BudgetConfig
    period_start: float = 0.0
    tokens: int = 0
    cost: float = 0.0

    def roll(self, now: float) -> float:
        """Start a new period if `now` left the current one; returns the period's end."""
        start, end = period_bounds(self.budget.period, now)
        if start != self.period_start:
            self.period_start, self.tokens, self.cost = start, 0, 0.0
        return end

    def exhausted(self) -> str | None:
        budget = self.budget
        if budget.tokens is not None and self.tokens >= budget.tokens:
            return f"its {budget.period}ly budget of {budget.tokens} tokens"
        if budget.cost is not None and self.cost >= budget.cost:
            return f"its {budget.period}ly cost budget of {budget.cost:g}"
        return None


@dataclass(slots=True)
class KeyState:
    config: ApiKeyConfig
    running: int = 0
    spends: list[Spend] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: RejectReason
    advised_retry_s: int  # the Retry-After the client is given
    message: str


class Quotas:
    """The live counters of every configured key, kept across config reloads."""

    def __init__(self, keys: Iterable[ApiKeyConfig], clock: Clock = time.time) -> None:
        self.clock = clock
        self._keys: dict[str, KeyState] = {}
        self.configure(keys)

    def configure(self, keys: Iterable[ApiKeyConfig]) -> None:
        """New limits; a key keeps its running count, and its spend where the budget's
        period is unchanged."""
        old, self._keys = self._keys, {}
        for key in keys:
            state = old.get(key.id)
            kept = {s.budget.period: s for s in state.spends} if state else {}
            spends = [Spend(b, *_carry(kept.get(b.period))) for b in key.budgets]
            self._keys[key.id] = KeyState(key, state.running if state else 0, spends)

    def seed(self, period: str, spent: Mapping[str, tuple[int, float]]) -> None:
        """Add what each key used since the start of the current `period` (from the ledger,
        at startup), so a restart does not reset its budgets."""
        now = self.clock()
        for key_id, (tokens, cost) in spent.items():
            state = self._keys.get(key_id)
            for spend in state.spends if state else ():
                if spend.budget.period == period:
                    spend.roll(now)
                    spend.tokens += tokens
                    spend.cost += cost

    def periods(self) -> set[str]:
        return {s.budget.period for state in self._keys.values() for s in state.spends}

    def admit(self, key_id: str) -> Refusal | None:
        """Count the request in, or say which limit refuses it (changing nothing)."""
        state = self._keys.get(key_id)
        if state is None:
            return None
        cap = state.config.max_concurrent
        if cap is not None and state.running >= cap:
            return Refusal(RejectReason.CONCURRENCY, 1,
                           f"This key may run {cap} requests at once; retry when one ends.")
        now = self.clock()
        for spend in state.spends:
            end = spend.roll(now)
            limit = spend.exhausted()
            if limit is not None:
                return Refusal(RejectReason.BUDGET, max(1, math.ceil(end - now)),
                               f"This key has used {limit}; it renews at the start of the "
                               "next period.")
        state.running += 1
        return None

    def finish(self, key_id: str, tokens: int, cost: float) -> None:
        """An admitted request ended: it no longer runs, and what it used is charged."""
        state = self._keys.get(key_id)
        if state is None:
            return
        state.running = max(0, state.running - 1)
        now = self.clock()
        for spend in state.spends:
            spend.roll(now)
            spend.tokens += tokens
            spend.cost += cost

    def running(self, key_id: str) -> int:
        state = self._keys.get(key_id)
        return state.running if state else 0


def _carry(spend: Spend | None) -> tuple[float, int, float]:
    if spend is None:
        return 0.0, 0, 0.0
    return spend.period_start, spend.tokens, spend.cost
