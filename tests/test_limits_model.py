"""The Lua scripts of the shared per-key limits against their pure model
(`policies.limits.model`), step by step.

Hypothesis draws one key's limits (concurrency, rpm, tpm, budgets) and drives the scripts
(reserve, settle, renew, seed) in random orders; the model takes each step at the time
Redis said it ran (RESERVE and SETTLE return it) and predicts the reply. Time passes for
the buckets and the budget periods by moving their stored times back in both, and for
single holds by setting their expiry to 0 (the next script purges them). After every
step Redis's keys must equal the model's book.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from policies.limits import model
from policies.limits.model import PERIODS, Book, Budget, Limits
from policies.slots.limits import limit_args, refused
from policies.slots.limits_lua import KEY_NAMES, PRELUDE, RENEW, RESERVE, SEED, SETTLE
from tests.support.scripts import scripts_on_redis

TTL_MS = 600_000  # nothing expires by itself while a test runs: the rules expire holds
BOOK, HOLDS, HELD, GONE = KEYS = [f"{{t:limits:k}}:{name}" for name in KEY_NAMES]
SCRIPTS = {"reserve": RESERVE, "renew": RENEW, "settle": SETTLE, "seed": SEED}


@dataclass
class Store:
    client: redis.Redis
    scripts: dict[str, Any]

    def call(self, script: str, args: list[Any]) -> Any:
        return self.scripts[script](keys=KEYS, args=args)

    def now(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    with scripts_on_redis(SCRIPTS) as (client, scripts):
        yield Store(client, scripts)


budgets = st.lists(st.builds(
    Budget, st.sampled_from(PERIODS), st.one_of(st.none(), st.sampled_from([10, 20, 50])),
    st.one_of(st.none(), st.sampled_from([0.05, 0.5, 2.0]))).filter(
        lambda b: b.tokens is not None or b.cost is not None), max_size=2)
limits_drawn = st.builds(
    Limits, st.one_of(st.none(), st.integers(1, 3)), st.one_of(st.none(), st.integers(1, 4)),
    st.one_of(st.none(), st.sampled_from([10, 30, 200])), budgets.map(tuple))
costs = st.sampled_from([0.0, 0.01, 0.1, 0.3, 1.0 / 3])
sizes = st.sampled_from([0, 5, 10, 25, 120])  # equal sums are the edge cases


class LimitsMachine(RuleBasedStateMachine):
    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.book = Book()
        self.limits = Limits()
        self.ids: list[str] = ["h0"]  # every hold ever asked for, and one never seen
        self.estimates: dict[str, int] = {}
        self.made = 0

    @initialize(limits=limits_drawn)
    def fresh_key(self, limits: Limits) -> None:
        self.store.client.flushall()
        self.limits = limits

    def live_first(self) -> list[str]:
        return [*self.book.holds, *(i for i in self.ids if i not in self.book.holds)]

    @rule(tokens=sizes, cost=costs)
    def reserve(self, tokens: int, cost: float) -> None:
        self.made += 1
        hold = f"h{self.made}"
        self.ids.append(hold)
        reply = self.store.call("reserve", [hold, TTL_MS, tokens, repr(cost),
                                            *limit_args(self.limits)])
        now = int(reply[3])
        expected = model.reserve(self.book, self.limits, hold, tokens, cost, now,
                                 now + TTL_MS)
        assert refused(reply, self.limits) == expected
        if expected is None:
            self.estimates[hold] = tokens

    @rule(data=st.data(), tokens=sizes, cost=costs)
    def settle(self, data: st.DataObject, tokens: int, cost: float) -> None:
        hold = data.draw(st.sampled_from(self.live_first()))
        estimate = self.estimates.get(hold, 0)
        reply = self.store.call("settle", [hold, estimate, tokens, repr(cost),
                                           *limit_args(self.limits)])
        held = model.settle(self.book, self.limits, hold, estimate, tokens, cost,
                            int(reply[1]))
        assert bool(reply[0]) == held

    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        holds = data.draw(st.lists(st.sampled_from(self.live_first()), unique=True,
                                   min_size=1, max_size=3))
        lost = self.store.call("renew", [TTL_MS, *holds])
        now = self.store.now()
        expected = model.renew(self.book, holds, now, now + TTL_MS)
        assert [i.decode() for i in lost] == expected
        for hold in set(holds) - set(expected):  # the model's expiry is Redis's
            self.book.holds[hold].expiry = self.store.client.zscore(HOLDS, hold) or 0

    @rule(period=st.sampled_from(PERIODS), tokens=sizes, cost=costs)
    def seed(self, period: str, tokens: int, cost: float) -> None:
        seeded = self.store.call("seed", [period, tokens, repr(cost)])
        assert bool(seeded) == model.seed(self.book, period, tokens, cost, self.store.now())

    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        """A hold's process stopped renewing it, and its TTL passed. The draw is from every
        id ever asked for, not from the live ones: which reservations were granted depends
        on Redis's clock (the buckets refill with time), and what is drawn must not, or
        hypothesis cannot replay a run."""
        hold = data.draw(st.sampled_from(self.ids))
        live = self.book.holds.get(hold)
        if live is None or live.expiry == 0:
            return
        assert self.store.client.zadd(HOLDS, {hold: 0}, xx=True, ch=True) == 1
        live.expiry = 0

    @rule(ms=st.integers(1, 120_000))
    def buckets_refill(self, ms: int) -> None:
        """Time passes for the buckets: their last change moves back."""
        for name in ("rpm", "tpm"):
            bucket = getattr(self.book, name)
            if bucket is not None:
                bucket.at -= ms
                self.store.client.hset(BOOK, f"{name}_at", repr(bucket.at))

    @rule(period=st.sampled_from(PERIODS))
    def period_passes(self, period: str) -> None:
        """A budget's period ends: the spend recorded is of the one before."""
        spend = self.book.spends.get(period)
        if spend is not None:
            spend.start -= 1000
            self.store.client.hset(BOOK, f"{period}_s", repr(spend.start))

    @invariant()
    def redis_equals_the_model(self) -> None:
        pipe = self.store.client.pipeline(transaction=True)
        pipe.hgetall(BOOK)
        pipe.zrange(HOLDS, 0, -1, withscores=True)
        pipe.hgetall(HELD)
        book_raw, holds_raw, held_raw = pipe.execute()
        raw = {k.decode(): float(v) for k, v in book_raw.items()}
        holds = {k.decode(): v for k, v in holds_raw}
        held = {k.decode(): v.decode().split() for k, v in held_raw.items()}
        book = self.book
        assert set(holds) == set(book.holds) == set(held)
        for hold_id, hold in book.holds.items():
            assert holds[hold_id] == (0 if hold.expiry == 0 else hold.expiry)
            assert int(held[hold_id][0]) == hold.tokens
            assert float(held[hold_id][1]) == hold.cost
        assert raw.get("rt", 0) == book.reserved_tokens
        assert raw.get("rc", 0) == pytest.approx(book.reserved_cost, abs=1e-9)
        for name in ("rpm", "tpm"):
            bucket = getattr(book, name)
            if bucket is None:
                assert f"{name}_l" not in raw
            else:
                assert raw[f"{name}_l"] == pytest.approx(bucket.level, abs=1e-9)
                assert raw[f"{name}_at"] == bucket.at
        for period, spend in book.spends.items():
            assert raw[f"{period}_s"] == spend.start
            assert raw[f"{period}_t"] == spend.tokens
            assert raw[f"{period}_c"] == pytest.approx(spend.cost, abs=1e-9)
        assert not {k for k in raw if k[-2:] in ("_s", "_t", "_c")} - {
            f"{p}_{x}" for p in book.spends for x in "stc"}
        assert math.isfinite(raw.get("rc", 0))


def test_scripts_follow_the_model(store: Store) -> None:
    class OnThisServer(LimitsMachine):
        def __init__(self) -> None:
            super().__init__(store)

    run_state_machine_as_test(
        OnThisServer,
        settings=settings(max_examples=150, stateful_step_count=30, deadline=None,
                          database=None),
    )


@pytest.mark.parametrize("period", PERIODS)
def test_the_scripts_periods_are_the_models(store: Store, period: str) -> None:
    """Redis's UTC calendar (hours, days, months of any length, leap years) is Python's."""
    bounds = store.client.register_script(
        PRELUDE + "local s, e = bounds(ARGV[1], tonumber(ARGV[2])) return {s, e}")
    day = 86_400_000
    for at in [0, 951_782_400_000 - 1, 951_782_400_000, 4_107_542_399_999,
               *range(1_700_000_000_000, 1_700_000_000_000 + 3000 * day, 7 * day + 3_601_001)]:
        assert [int(x) for x in bounds(args=[period, at])] == list(
            model.period_bounds_ms(period, at)), at
