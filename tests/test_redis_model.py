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
"""

from __future__ import annotations

import asyncio
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
from tests.support import RedisServer, closed_port, require_program
from tests.support.lua_model import Model

TTL_MS = 600_000  # nothing expires by itself while a test runs: the rules expire things
CHANNEL = "{model}:wake"
KEYS = [f"{{model}}:{name}" for name in KEY_NAMES]
HOLDERS, WAITERS, ALIVE, _SEQ, FENCE, GRANTED, TOKENS, VERSION, SHED, PLACED, SEATS = KEYS
SCRIPTS = {"acquire": ACQUIRE, "enqueue": ENQUEUE, "poll": POLL, "renew": RENEW,
           "release": RELEASE, "withdraw": WITHDRAW}


@dataclass
class Store:
    """One redis-server for the module, a client and the registered scripts."""

    client: redis.Redis
    scripts: dict[str, Any]

    def call(self, script: str, args: list[str | int]) -> Any:
        return self.scripts[script](keys=KEYS, args=args)


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    server = RedisServer(require_program("redis-server"), closed_port())
    loop = asyncio.new_event_loop()  # only to start and stop the server
    loop.run_until_complete(server.start())
    client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
    try:
        yield Store(client, {name: client.register_script(text)
                             for name, text in SCRIPTS.items()})
    finally:
        client.close()
        loop.run_until_complete(server.stop(kill=True))
        loop.close()


def live_first(live: Iterable[str], every: list[str]) -> list[str]:
    """The ids in play first (drawn more often), then those granted, gone or unknown."""
    first = list(live)
    return first + [i for i in every if i not in first]


class PoolMachine(RuleBasedStateMachine):
    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.model = Model(replicas={}, queue_limit=0)
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
        self.model = Model({f"r{i}": n for i, n in enumerate(slots)}, queue_limit)

    @rule(data=st.data())
    def acquire(self, data: st.DataObject) -> None:
        lease = self.new_id("L")
        self.leases.append(lease)
        order, pairs = self.offer(data)
        reply = self.store.call("acquire", [lease, TTL_MS, CHANNEL, *pairs])
        expected = self.model.acquire(lease, order)
        assert self.counted(reply) == expected
        if reply[0]:
            self.granted(reply[0])
            self.on[lease] = expected[-1]

    @rule(ranks=st.lists(st.integers(0, 2), min_size=1, max_size=3))
    def enqueue(self, ranks: list[int]) -> None:
        """Newcomers of these classes line up (with a slot free or not: a poll serves them)."""
        for rank in ranks:
            ticket = self.new_id("T")
            self.tickets.append(ticket)
            reply = self.store.call(
                "enqueue", [self.model.queue_limit, ticket, TTL_MS, CHANNEL, rank])
            expected = self.model.enqueue(ticket, rank)
            assert self.counted(reply) == expected

    @rule(data=st.data())
    def poll(self, data: st.DataObject) -> None:
        """One replica's re-check: some of the tickets, in its order (tickets in line,
        the last first, are drawn more often than ones granted or gone)."""
        candidates = live_first(self.model.waiters[::-1], self.tickets)
        tickets = data.draw(st.lists(st.sampled_from(candidates), unique=True, max_size=4))
        order, pairs = self.offer(data)
        reply = self.store.call(
            "poll", [TTL_MS, CHANNEL, len(order), *pairs, *tickets])
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
        reply = self.store.call(
            "renew", [lease, TTL_MS, self.model.replicas[replica], CHANNEL, replica])
        assert reply == self.model.renew(lease, replica)
        if reply == 2:
            self.on[lease] = replica
            assert self.model.fence == before + 1
            self.granted(self.model.fence)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(live_first(self.model.holders, self.leases)))
        reply = self.store.call("release", [lease, CHANNEL])
        expected = self.model.release(lease)
        assert self.counted(reply) == expected

    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(live_first(self.model.waiters, self.tickets)))
        reply = self.store.call("withdraw", [ticket, CHANNEL])
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


def test_scripts_follow_the_model(store: Store) -> None:
    class OnThisServer(PoolMachine):
        def __init__(self) -> None:
            super().__init__(store)

    run_state_machine_as_test(
        OnThisServer,
        settings=settings(max_examples=150, stateful_step_count=30, deadline=None,
                          database=None),
    )
