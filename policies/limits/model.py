"""The per-key limits as one pure model: what a key holds, and how a request is reserved,
renewed and settled against it. No I/O, no clock: time is passed in (ms).

The local book (`policies.limits.quotas.Quotas`) runs this model in the process; the Lua scripts
of the shared book (`policies.slots.limits_lua`) mirror it step by step in Redis, on
Redis's clock (tests/test_limits_model.py holds one to the other).

A key may have:
- `max_concurrent`: its live reservations (requests admitted and not yet settled);
- `rpm` and `tpm`: token buckets of that capacity, refilled continuously at figure/60 per
  second. A request is admitted while the bucket is above 0, then its cost is taken (rpm:
  1, tpm: its estimated tokens), so a bucket may go negative; a refusal's retry is the
  time until it is back above 0. Settling gives tpm back (estimate - actual), or takes
  more;
- budgets of tokens and cost per UTC hour, day or month. A request is admitted while
  spent + reserved < limit (room remains), then its estimate is reserved; settling
  charges what it actually used. With actual <= estimate, a budget is overspent by at
  most one request's tokens.

A reservation carries an expiry (a crashed process's reservations come back when it
passes); `purge` drops the expired ones and gives back what they reserved. A refused
request changes nothing.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from policies.config import ApiKeyConfig

MINUTE_MS = 60_000
PERIODS = ("hour", "day", "month")


class Limit(enum.StrEnum):
    """Which limit refused a request."""

    CONCURRENCY = "max_concurrent"
    BUDGET = "budget"
    RPM = "rpm"
    TPM = "tpm"


@dataclass(frozen=True, slots=True)
class Budget:
    period: str  # hour | day | month
    tokens: int | None
    cost: float | None


@dataclass(frozen=True, slots=True)
class Limits:
    """One key's limits (None: not limited)."""

    max_concurrent: int | None = None
    rpm: int | None = None
    tpm: int | None = None
    budgets: tuple[Budget, ...] = ()

    @classmethod
    def of(cls, key: ApiKeyConfig, share: int = 1) -> Limits | None:
        """The key's limits, its rates and concurrency cut to a 1/`share` part (at least 1:
        one process's part while a shared book is away); None when it has none."""
        def part(figure: int | None) -> int | None:
            return None if figure is None else max(1, figure // share)

        budgets = tuple(Budget(b.period, b.tokens, b.cost) for b in key.budgets)
        if key.max_concurrent is None and key.rpm is None and key.tpm is None and not budgets:
            return None
        return cls(part(key.max_concurrent), part(key.rpm), part(key.tpm), budgets)


def period_bounds_ms(period: str, now_ms: int) -> tuple[int, int]:
    """The start and end (Unix ms) of the UTC `period` holding `now_ms`."""
    at = datetime.fromtimestamp(now_ms // 1000, UTC)
    if period == "hour":
        start = at.replace(minute=0, second=0, microsecond=0)
        end = start + timedelta(hours=1)
    elif period == "day":
        start = at.replace(hour=0, minute=0, second=0, microsecond=0)
        end = start + timedelta(days=1)
    else:
        start = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        end = (start + timedelta(days=32)).replace(day=1)
    return int(start.timestamp()) * 1000, int(end.timestamp()) * 1000


@dataclass(slots=True)
class Bucket:
    level: float  # tokens left (may be negative)
    at: int  # ms of the last change

    def refilled(self, capacity: int, now: int) -> float:
        """Its level at `now`: refilled at capacity per minute, never above capacity."""
        return min(float(capacity), self.level + (now - self.at) * capacity / MINUTE_MS)


def retry_after_ms(level: float, capacity: int) -> int:
    """How long until a bucket at `level` (<= 0) is back above 0."""
    return math.floor(-level * MINUTE_MS / capacity) + 1


@dataclass(slots=True)
class Spend:
    start: int = -1  # the period's start (ms); -1: never charged
    tokens: int = 0
    cost: float = 0.0

    def roll(self, start: int) -> None:
        if start != self.start:
            self.start, self.tokens, self.cost = start, 0, 0.0


@dataclass(slots=True)
class Hold:
    tokens: int
    cost: float
    expiry: float  # ms; math.inf: never (a local book's)


@dataclass(slots=True)
class Book:
    """What one key holds."""

    holds: dict[str, Hold] = field(default_factory=dict)
    reserved_tokens: int = 0  # of the live holds
    reserved_cost: float = 0.0
    rpm: Bucket | None = None  # None: full
    tpm: Bucket | None = None
    spends: dict[str, Spend] = field(default_factory=dict)  # by period


@dataclass(frozen=True, slots=True)
class Refusal:
    limit: Limit
    retry_ms: int  # until the limit would admit it
    budget: Budget | None = None  # the budget that refused it


def _level(bucket: Bucket | None, capacity: int, now: int) -> float:
    return float(capacity) if bucket is None else bucket.refilled(capacity, now)


def _spend(book: Book, period: str, now: int) -> tuple[Spend, int]:
    """The key's spend in the current `period`, and the period's end."""
    start, end = period_bounds_ms(period, now)
    spend = book.spends.setdefault(period, Spend())
    spend.roll(start)
    return spend, end


def _drop(book: Book, hold_id: str) -> bool:
    hold = book.holds.pop(hold_id, None)
    if hold is None:
        return False
    if book.holds:
        book.reserved_tokens -= hold.tokens
        book.reserved_cost -= hold.cost
    else:  # exactly nothing, whatever the sums' rounding
        book.reserved_tokens, book.reserved_cost = 0, 0.0
    return True


def purge(book: Book, now: int) -> None:
    """Drop the holds whose expiry passed, giving back what they reserved."""
    for hold_id in [i for i, h in book.holds.items() if h.expiry <= now]:
        _drop(book, hold_id)


def check(book: Book, limits: Limits, now: int) -> Refusal | None:
    """Which limit refuses a request now, if one does (none depends on its estimate).
    Checked in order: concurrency, budgets, rpm, tpm."""
    purge(book, now)
    if limits.max_concurrent is not None and len(book.holds) >= limits.max_concurrent:
        return Refusal(Limit.CONCURRENCY, 1000)
    for budget in limits.budgets:
        start, end = period_bounds_ms(budget.period, now)
        spend = book.spends.get(budget.period)
        spent_tokens, spent_cost = (spend.tokens, spend.cost) if (
            spend is not None and spend.start == start) else (0, 0.0)
        if ((budget.tokens is not None
             and spent_tokens + book.reserved_tokens >= budget.tokens)
                or (budget.cost is not None
                    and spent_cost + book.reserved_cost >= budget.cost)):
            return Refusal(Limit.BUDGET, end - now, budget)
    for limit, capacity, bucket in ((Limit.RPM, limits.rpm, book.rpm),
                                    (Limit.TPM, limits.tpm, book.tpm)):
        if capacity is not None and (level := _level(bucket, capacity, now)) <= 0:
            return Refusal(limit, retry_after_ms(level, capacity))
    return None


def reserve(book: Book, limits: Limits, hold_id: str, tokens: int, cost: float, now: int,
            expiry: float) -> Refusal | None:
    """Admit a request of `tokens` and `cost` (estimated) as hold `hold_id`, or say which
    limit refuses it, changing nothing then."""
    refused = check(book, limits, now)
    if refused is not None:
        return refused
    if limits.rpm is not None:
        book.rpm = Bucket(_level(book.rpm, limits.rpm, now) - 1, now)
    if limits.tpm is not None:
        book.tpm = Bucket(_level(book.tpm, limits.tpm, now) - tokens, now)
    book.holds[hold_id] = Hold(tokens, cost, expiry)
    book.reserved_tokens += tokens
    book.reserved_cost += cost
    return None


def renew(book: Book, hold_ids: Iterable[str], now: int, expiry: float) -> list[str]:
    """Extend the given holds; returns those no longer held (expired, or never held)."""
    purge(book, now)
    lost = []
    for hold_id in hold_ids:
        hold = book.holds.get(hold_id)
        if hold is None:
            lost.append(hold_id)
        else:
            hold.expiry = expiry
    return lost


def settle(book: Book, limits: Limits, hold_id: str, estimate: int, tokens: int, cost: float,
           now: int) -> bool:
    """A request ended having used `tokens` and `cost` (`estimate`: the tokens it
    reserved): its hold is given back, tpm gets estimate - tokens back (or loses more),
    and every budget's period is charged. Returns whether the hold was still live (a lost
    one is charged all the same)."""
    purge(book, now)
    held = _drop(book, hold_id)
    if limits.tpm is not None:
        book.tpm = Bucket(_level(book.tpm, limits.tpm, now) + (estimate - tokens), now)
        book.tpm.level = min(float(limits.tpm), book.tpm.level)
    for period in dict.fromkeys(b.period for b in limits.budgets):
        spend, _ = _spend(book, period, now)
        spend.tokens += tokens
        spend.cost += cost
    return held


def seed(book: Book, period: str, tokens: int, cost: float, now: int) -> bool:
    """Start the current `period`'s spend at what the ledger says, unless the book already
    has a spend for it (another process seeded it, or charged it): returns whether it did."""
    start, _ = period_bounds_ms(period, now)
    spend = book.spends.get(period)
    if spend is not None and spend.start == start:
        return False
    book.spends[period] = Spend(start, tokens, cost)
    return True
