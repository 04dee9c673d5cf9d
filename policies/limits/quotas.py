"""The per-key limits of one process: the model of `policies.limits.model` run in memory.

Pure bookkeeping, no I/O. `reserve` checks every limit before the request takes anything
(a slot, a place in a queue); a refused request changes nothing. An admitted request holds
its reservation until `settle`, which also charges what it actually used. It serves
`coordination.mode: local`, and a shared book's fallback while Redis is away
(`fail_open_local`: each key's concurrency and rates cut to a per-process share).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from policies.config import ApiKeyConfig
from policies.limits import model
from policies.limits.model import Book, Limit, Limits, period_bounds_ms
from policies.scheduler.admission import RejectReason

Clock = Callable[[], float]  # Unix seconds


def period_bounds(period: str, now: float) -> tuple[float, float]:
    """The start and end (Unix seconds) of the UTC `period` holding `now`."""
    start, end = period_bounds_ms(period, int(now * 1000))
    return start / 1000, end / 1000


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: RejectReason
    retry_in_s: float  # when the limit lets it through again (the refusal table clamps)
    message: str


@dataclass(frozen=True, slots=True)
class QuotaHold:
    """One admitted request's reservation: settled once, in the book that took it."""

    key_id: str
    id: str
    tokens: int  # estimated
    cost: float  # estimated
    shared: bool  # held in Redis, not in this process


def refusal(refused: model.Refusal, limits: Limits) -> Refusal:
    """The client's answer for a refusal of the model."""
    retry_s = refused.retry_ms / 1000
    if refused.limit is Limit.CONCURRENCY:
        return Refusal(RejectReason.CONCURRENCY, retry_s,
                       f"This key may run {limits.max_concurrent} requests at once; retry "
                       "when one ends.")
    if refused.limit is Limit.BUDGET:
        budget = refused.budget
        assert budget is not None
        what = (f"{budget.tokens} tokens" if budget.tokens is not None
                else f"cost budget of {budget.cost:g}")
        if budget.tokens is not None and budget.cost is not None:
            what = f"{budget.tokens} tokens or {budget.cost:g} in cost"
        return Refusal(RejectReason.BUDGET, retry_s,
                       f"This key has used its {budget.period}ly budget of {what}; it "
                       "renews at the start of the next period.")
    figure = limits.rpm if refused.limit is Limit.RPM else limits.tpm
    unit = "requests" if refused.limit is Limit.RPM else "tokens"
    return Refusal(RejectReason.RATE_LIMIT, retry_s,
                   f"This key may use {figure} {unit} per minute ({refused.limit.value}); "
                   f"retry after {max(1, math.ceil(retry_s))} s.")


class Quotas:
    """Every limited key's book, kept across config reloads."""

    def __init__(self, keys: Iterable[ApiKeyConfig], clock: Clock = time.time,
                 share: int = 1) -> None:
        self.clock = clock
        self.share = share  # each key's concurrency and rates cut to 1/share
        self.limits: dict[str, Limits] = {}  # the limited keys only
        self._books: dict[str, Book] = {}
        self._ids = itertools.count()
        self.configure(keys)

    def _now(self) -> int:
        return int(self.clock() * 1000)

    def configure(self, keys: Iterable[ApiKeyConfig]) -> None:
        """New limits; a key keeps its reservations, buckets and spend (a budget's, while
        its period is unchanged)."""
        self.limits = {key.id: limits for key in keys
                       if (limits := Limits.of(key, self.share)) is not None}
        for key_id in [k for k, b in self._books.items()
                       if k not in self.limits and not b.holds]:
            del self._books[key_id]

    def seed(self, period: str, spent: Mapping[str, tuple[int, float]]) -> None:
        """Start each key's spend in the current `period` at what the ledger says it used
        (at startup), so a restart does not reset its budgets."""
        now = self._now()
        for key_id, (tokens, cost) in spent.items():
            limits = self.limits.get(key_id)
            if limits is not None and any(b.period == period for b in limits.budgets):
                model.seed(self._books.setdefault(key_id, Book()), period, tokens, cost, now)

    def periods(self) -> set[str]:
        return {b.period for limits in self.limits.values() for b in limits.budgets}

    def check(self, key_id: str) -> Refusal | None:
        """Would a request of the key be refused now? Nothing is taken (asked before its
        body is read; `reserve` decides)."""
        limits = self.limits.get(key_id)
        book = self._books.get(key_id)
        if limits is None or book is None:
            return None
        refused = model.check(book, limits, self._now())
        return None if refused is None else refusal(refused, limits)

    def reserve(self, key_id: str, tokens: int, cost: float,
                hold_id: str | None = None) -> QuotaHold | Refusal | None:
        """Reserve an admitted request's estimate, or say which limit refuses it
        (changing nothing). None: the key has no limits."""
        limits = self.limits.get(key_id)
        if limits is None:
            return None
        book = self._books.setdefault(key_id, Book())
        hold_id = hold_id or f"local-{next(self._ids)}"
        refused = model.reserve(book, limits, hold_id, tokens, cost, self._now(), math.inf)
        if refused is not None:
            return refusal(refused, limits)
        return QuotaHold(key_id, hold_id, tokens, cost, shared=False)

    def settle(self, hold: QuotaHold, tokens: int, cost: float) -> None:
        """An admitted request ended: its reservation is given back and what it used is
        charged."""
        book = self._books.get(hold.key_id)
        limits = self.limits.get(hold.key_id, Limits())
        if book is None:
            return
        model.settle(book, limits, hold.id, hold.tokens, tokens, cost, self._now())

    def charge(self, key_id: str, tokens: int, cost: float) -> None:
        """What a request settled elsewhere (in Redis) used: kept for the fallback book."""
        limits = self.limits.get(key_id)
        if limits is not None and limits.budgets:
            book = self._books.setdefault(key_id, Book())
            model.settle(book, Limits(budgets=limits.budgets), "", 0, tokens, cost,
                         self._now())

    def running(self, key_id: str) -> int:
        book = self._books.get(key_id)
        return len(book.holds) if book else 0
