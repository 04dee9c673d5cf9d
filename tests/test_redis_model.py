"""The Lua scripts of a shared pool against a reference model, step by step.

Hypothesis drives one pool's scripts (acquire, enqueue, poll, renew, release, withdraw)
in random orders, and lets time pass for single leases and tickets by setting their
expiry to 0 (the next script that purges drops them). A plain-Python model predicts
every reply; after every step Redis's keys must equal the model's, no more than
`capacity` slots may be held, and no waiter may be overtaken without a slot kept for it
(unless a lease Redis lost takes its slot back: its engine never stopped running it, or
a newcomer of a higher priority class lined up ahead of it). Newcomers come in three
classes; a full line makes room for a higher class by shedding its newest sheddable one.
The backend is a group of one to three engine replicas of one or two slots; each call
offers some of them (a process's healthy ones) in some order, and no replica may ever
hold more than its slots (the model is tests/support/lua_model.py).

A `fair` pool's scripts (policies/slots/lua_fair.py) run the same steps against the model
of tests/support/lua_fair_model.py: newcomers of a few tenants and weights, each class's
line in the order of `policies.limits.fairness`, renewals and releases charging answer tokens,
and Redis's counters, shares and tenants' index equal to the model's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
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

from policies.slots.lua import ACQUIRE, ENQUEUE, KEY_NAMES, POLL, RELEASE, RENEW, WITHDRAW
from policies.slots.lua_fair import (
    FAIR_ACQUIRE,
    FAIR_ENQUEUE,
    FAIR_POLL,
    FAIR_RELEASE,
    FAIR_RENEW,
    FAIR_WITHDRAW,
)
from tests.support.lua_fair_model import FairModel, Owner
from tests.support.lua_model import Model
from tests.support.scripts import scripts_on_redis

TTL_MS = 600_000  # nothing expires by itself while a test runs: the rules expire things
CHANNEL = "{model}:wake"
KEYS = [f"{{model}}:{name}" for name in KEY_NAMES]
HOLDERS, WAITERS, ALIVE, _SEQ, FENCE, GRANTED, TOKENS, VERSION, SHED, PLACED, SEATS = KEYS[:11]
SERVED, SHARES, LINE, BACKLOG, LAST = KEYS[11:]
SCRIPTS = {"acquire": ACQUIRE, "enqueue": ENQUEUE, "poll": POLL, "renew": RENEW,
           "release": RELEASE, "withdraw": WITHDRAW, "fair_acquire": FAIR_ACQUIRE,
           "fair_enqueue": FAIR_ENQUEUE, "fair_poll": FAIR_POLL, "fair_renew": FAIR_RENEW,
           "fair_release": FAIR_RELEASE, "fair_withdraw": FAIR_WITHDRAW}
SHARES_DRAWN = st.tuples(st.sampled_from("abcdefghijkl"), st.sampled_from([1, 2, 4]),
                         st.integers(0, 8), st.integers(0, 24))  # tenant, weight, prompt, answer


@dataclass
class Store:
    """One redis-server for the module, a client and the registered scripts."""

    client: redis.Redis
    scripts: dict[str, Any]

    def call(self, script: str, args: list[str | int]) -> Any:
        return self.scripts[script](keys=KEYS, args=args)


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    with scripts_on_redis(SCRIPTS) as (client, scripts):
        yield Store(client, scripts)


def live_first(live: Iterable[str], every: list[str]) -> list[str]:
    """The ids in play first (drawn more often), then those granted, gone or unknown."""
    first = list(live)
    return first + [i for i in every if i not in first]


class PoolMachine(RuleBasedStateMachine):
    fair = False  # the `fair` scripts and model

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.model = Model(replicas={}, queue_limit=0)
        self.fair_model = FairModel(replicas={}, queue_limit=0)
        self.on: dict[str, str] = {}  # every lease ever granted -> its replica
        # Every id a lease was asked or granted for, every ticket ever given out, and
        # one of each that Redis never saw (no rule has a precondition: rules disabled
        # early in a run would skew the choice of rules).
        self.leases: list[str] = ["L0"]
        self.tickets: list[str] = ["T0"]
        self.made = 0
        self.last_token = 0
        self.last_now = 0
        self.version_base: int | None = None  # Redis's version before the first change
        self.version_floor = 0
        self.short = 0  # overtaken waiters without a free slot (see the invariant)
        self.reclaims = 0

    def call(self, step: str, args: list[str | int]) -> Any:
        return self.store.call(("fair_" if self.fair else "") + step, args)

    def new_id(self, kind: str) -> str:
        self.made += 1
        return f"{kind}{self.made}"

    def granted(self, token: int) -> None:
        assert token > self.last_token, "fencing tokens must only grow"
        self.last_token = token

    def changes(self, version: int) -> int:
        """Redis's version as the number of changes so far. The counter starts at Redis's
        time in ms x 1000 at the first change, so it grows across a restart that lost it."""
        if version == 0:  # never changed
            return 0
        if self.version_base is None:
            self.version_base = version - self.model.version
            assert self.version_base % 1000 == 0, "not a time in ms x 1000"
            assert self.version_base >= self.version_floor, "older than the pool"
        return version - self.version_base

    def counted(self, reply: list[Any], at: int = 1) -> list[Any]:
        """`reply` with its version (at `at`) as the number of changes and its seats (just
        after the counts) as a dict; after the model has taken the same step (the first
        change tells where the counter started)."""
        seats = reply[at + 4]
        held = {seats[i].decode(): int(seats[i + 1]) for i in range(0, len(seats), 2)}
        rest = [r.decode() if isinstance(r, bytes) else r for r in reply[at + 5:]]
        return [*reply[:at], self.changes(reply[at]), *reply[at + 1:at + 4], held, *rest]

    def offer(self, data: st.DataObject) -> tuple[list[str], list[str | int]]:
        """A process's healthy replicas in its order of preference (often all), and the
        (name, slots) pairs the scripts are passed."""
        names = list(self.model.replicas)
        order = data.draw(st.one_of(st.permutations(names), st.lists(
            st.sampled_from(names), unique=True, max_size=len(names))))
        return order, [x for r in order for x in (r, self.model.replicas[r])]

    @initialize(slots=st.lists(st.integers(1, 2), min_size=1, max_size=3),
                queue_limit=st.integers(3, 4))
    def empty_pool(self, slots: list[int], queue_limit: int) -> None:
        client = self.store.client
        client.flushall()
        seconds, micros = client.time()
        self.version_floor = (seconds * 1000 + micros // 1000) * 1000
        replicas = {f"r{i}": n for i, n in enumerate(slots)}
        self.fair_model = FairModel(replicas, queue_limit, kept=8)
        self.model = self.fair_model if self.fair else Model(replicas, queue_limit)

    @rule(data=st.data())
    def acquire(self, data: st.DataObject) -> None:
        lease = self.new_id("L")
        self.leases.append(lease)
        order, pairs = self.offer(data)
        if self.fair:  # a newcomer of a tenant (or of none: charged nothing)
            drawn = data.draw(st.one_of(st.none(), SHARES_DRAWN))
            owner = None if drawn is None else Owner(drawn[0], drawn[1], drawn[2], drawn[2])
            share: list[str | int] = ["", 1, 0] if drawn is None else [*drawn[:3]]
            reply = self.call("acquire", [lease, TTL_MS, CHANNEL, *share, *pairs])
            expected = self.fair_model.acquire_share(lease, order, owner)
        else:
            reply = self.call("acquire", [lease, TTL_MS, CHANNEL, *pairs])
            expected = self.model.acquire(lease, order)
        assert self.counted(reply) == expected
        if reply[0]:
            self.granted(reply[0])
            self.on[lease] = expected[-1]

    @rule(newcomers=st.lists(st.tuples(st.integers(0, 2), SHARES_DRAWN), min_size=1,
                             max_size=3))
    def enqueue(self, newcomers: list[tuple[int, tuple[str, int, int, int]]]) -> None:
        """Newcomers of these classes (and, in a fair line, tenants) line up (with a slot
        free or not: a poll serves them)."""
        for rank, (tenant, weight, prompt, answer) in newcomers:
            ticket = self.new_id("T")
            self.tickets.append(ticket)
            args: list[str | int] = [self.model.queue_limit, ticket, TTL_MS, CHANNEL, rank]
            if not self.fair:
                reply = self.call("enqueue", args)
                expected = self.model.enqueue(ticket, rank)
                assert self.counted(reply) == expected
                continue
            owner = Owner(tenant, weight, prompt, prompt + answer)
            model = self.fair_model
            reply = self.call("enqueue", [*args, tenant, weight, prompt, owner.expected,
                                          model.kept, model.places])
            expected = model.enqueue_share(ticket, rank, owner)
            assert self.counted(reply) == expected

    @rule(data=st.data())
    def poll(self, data: st.DataObject) -> None:
        """One replica's re-check: some of the tickets, in its order (tickets in line,
        the last first, are drawn more often than ones granted or gone); in a fair line
        often all those in line, so that the order decides."""
        candidates = live_first(self.model.waiters[::-1], self.tickets)
        some = st.lists(st.sampled_from(candidates), unique=True, max_size=4)
        if self.fair:
            some = st.one_of(st.permutations(self.model.waiters), some)
        tickets = data.draw(some)
        order, pairs = self.offer(data)
        places = [self.fair_model.places] if self.fair else []
        reply = self.call("poll", [TTL_MS, CHANNEL, *places, len(order), *pairs, *tickets])
        counts, statuses = self.model.poll(tickets, order)
        assert self.counted([*reply[:4], reply[6], *reply[7:]], at=0) == [*counts, *statuses]
        assert reply[4] >= self.last_now, "Redis's clock went back"
        self.last_now = reply[4]
        assert len(reply[5]) == len(self.model.holders)  # one grant time per lease
        for ticket, status, value, replica in zip(
                tickets, statuses[::3], statuses[1::3], statuses[2::3], strict=True):
            if status == 1 and ticket not in self.leases:
                self.leases.append(ticket)
                self.granted(value)
                self.on[ticket] = replica

    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(live_first(self.model.holders, self.leases)))
        replica = self.on.get(lease) or data.draw(st.sampled_from(list(self.model.replicas)))
        before = self.model.fence
        args: list[str | int] = [lease, TTL_MS, self.model.replicas[replica], CHANNEL, replica]
        if self.fair:  # with its answer's tokens since the last charge
            tokens = data.draw(st.integers(0, 30))
            reply = self.call("renew", [*args, tokens])
            assert reply == self.fair_model.renew_charging(lease, replica, tokens)
        else:
            reply = self.call("renew", args)
            assert reply == self.model.renew(lease, replica)
        if reply == 2:
            self.on[lease] = replica
            assert self.model.fence == before + 1
            self.granted(self.model.fence)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(live_first(self.model.holders, self.leases)))
        if self.fair:  # with its answer's tokens since the last charge
            tokens = data.draw(st.integers(0, 30))
            reply = self.call("release", [lease, CHANNEL, tokens])
            expected = self.fair_model.release_charging(lease, tokens)
        else:
            reply = self.call("release", [lease, CHANNEL])
            expected = self.model.release(lease)
        assert self.counted(reply) == expected

    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(live_first(self.model.waiters, self.tickets)))
        reply = self.call("withdraw", [ticket, CHANNEL])
        expected = self.model.withdraw(ticket)
        assert self.counted(reply) == expected

    @rule(data=st.data())
    def expire_lease(self, data: st.DataObject) -> None:
        """Its TTL passes (its replica stopped renewing)."""
        live = sorted(lease for lease, gone in self.model.holders.items() if not gone)
        if not live:
            return
        lease = data.draw(st.sampled_from(live))
        assert self.store.client.zadd(HOLDERS, {lease: 0}, xx=True, ch=True) == 1
        self.model.holders[lease] = True

    @rule(data=st.data())
    def expire_ticket(self, data: st.DataObject) -> None:
        """Its heartbeat lapses (its replica stopped polling)."""
        live = [ticket for ticket in self.model.waiters if ticket not in self.model.dead]
        if not live:
            return
        ticket = data.draw(st.sampled_from(live))
        assert self.store.client.zadd(ALIVE, {ticket: 0}, xx=True, ch=True) == 1
        self.model.dead.add(ticket)

    @invariant()
    def redis_equals_the_model(self) -> None:
        pipe = self.store.client.pipeline(transaction=True)
        pipe.zrange(HOLDERS, 0, -1, withscores=True)
        pipe.zrange(WAITERS, 0, -1)
        pipe.zrange(ALIVE, 0, -1, withscores=True)
        pipe.hgetall(TOKENS)
        pipe.zrange(GRANTED, 0, -1)
        pipe.get(VERSION)
        pipe.get(FENCE)
        pipe.zrange(SHED, 0, -1)
        pipe.hgetall(PLACED)
        pipe.hgetall(SEATS)
        holders, waiters, alive, tokens, granted, version, fence, shed, placed, seats = \
            pipe.execute()
        model = self.model
        assert len(holders) <= model.capacity
        held = {k.decode(): int(v) for k, v in seats.items()}
        assert held == model.seats()  # per replica, none listed at 0
        assert all(held[r] <= model.replicas[r] for r in held), "a replica above its slots"
        assert {k.decode(): v.decode() for k, v in placed.items()} == model.placed
        assert {lease.decode(): score == 0 for lease, score in holders} == model.holders
        assert [ticket.decode() for ticket in waiters] == model.waiters  # class, then FIFO
        assert {ticket.decode() for ticket in shed} == model.shed
        assert {ticket.decode(): score == 0 for ticket, score in alive} == {
            ticket: ticket in model.dead for ticket in model.waiters}
        assert {k.decode(): int(v) for k, v in tokens.items()} == model.tokens
        assert {lease.decode() for lease in granted} == set(model.holders)
        assert self.changes(int(version or 0)) == model.version
        assert int(fence or 0) == model.fence
        if self.fair:
            self.fair_keys_equal_the_model()

    def fair_keys_equal_the_model(self) -> None:
        """The counters, the last served's, the shares and the tenants' index."""
        pipe = self.store.client.pipeline(transaction=True)
        pipe.hgetall(SERVED)
        pipe.get(LAST)
        pipe.hgetall(SHARES)
        pipe.zrange(LINE, 0, -1)
        pipe.hgetall(BACKLOG)
        served, last, shares, line, backlog = pipe.execute()
        model = self.fair_model
        assert {k.decode(): float(v) for k, v in served.items()} == model.counters.served
        assert float(last or 0) == model.counters.last
        owners = {}
        for k, v in shares.items():
            weight, prompt, expected, tenant = v.decode().split("|", 3)
            owners[k.decode()] = Owner(tenant, float(weight), int(prompt), int(expected))
        assert owners == model.owners
        assert {m.decode() for m in line} == model.members()
        assert {k.decode(): int(v) for k, v in backlog.items()} == model.line()

    @invariant()
    def overtaken_waiters_keep_a_slot(self) -> None:
        """FIFO across replicas: a ticket granted ahead of older ones (another replica's,
        not polled yet) only took a slot that left room for every one of them. Only a
        renewal re-registering a lease may take such a slot (its engine is running it), or
        a newcomer of a higher class that lined up ahead."""
        model = self.model
        assert model.overtaken <= set(model.waiters)
        short = max(0, len(model.overtaken) - model.free)
        if model.reclaims == self.reclaims:
            assert short <= self.short, "a newcomer or a later ticket took a kept slot"
        self.short, self.reclaims = short, model.reclaims


@pytest.mark.parametrize("fair", [False, True], ids=["fifo", "fair"])
def test_scripts_follow_the_model(store: Store, fair: bool) -> None:
    class OnThisServer(PoolMachine):
        def __init__(self) -> None:
            super().__init__(store)
            self.fair = fair

    run_state_machine_as_test(
        OnThisServer,
        settings=settings(max_examples=150, stateful_step_count=30, deadline=None,
                          database=None),
    )
