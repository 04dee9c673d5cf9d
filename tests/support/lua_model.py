"""The reference model of a shared pool's Lua scripts (tests/test_redis_model.py): what each
script should do to one pool and answer, in plain Python.

The pool's backend is a group of engine replicas, each with its slots; a process offers
the scripts the replicas it considers healthy, in its order of preference (`offer`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

SHEDDABLE = 2


@dataclass
class Model:
    """One pool as the scripts should keep it. Expired leases and dead tickets stay
    until a script purges them, as in Redis."""

    replicas: dict[str, int]  # name -> slots
    queue_limit: int
    holders: dict[str, bool] = field(default_factory=dict)  # lease id -> expired
    placed: dict[str, str] = field(default_factory=dict)  # lease id -> its replica
    waiters: list[str] = field(default_factory=list)  # by class, then FIFO
    ranks: dict[str, int] = field(default_factory=dict)  # ticket -> its class (0 first)
    shed: set[str] = field(default_factory=set)  # displaced, not yet told by a poll
    dead: set[str] = field(default_factory=set)  # waiters whose heartbeat expired
    tokens: dict[str, int] = field(default_factory=dict)  # holder -> fencing token
    overtaken: set[str] = field(default_factory=set)  # waiters someone behind got ahead of
    fence: int = 0
    version: int = 0  # changes so far: Redis's version counter less its starting value
    reclaims: int = 0  # leases re-registered by a renewal

    @property
    def capacity(self) -> int:
        return sum(self.replicas.values())

    def seats(self) -> dict[str, int]:
        """Holders per replica holding any."""
        return dict(Counter(self.placed.values()))

    def counts(self) -> list[Any]:
        sheddable = sum(self.ranks[t] == SHEDDABLE for t in self.waiters)
        return [self.version, len(self.holders), len(self.waiters), sheddable, self.seats()]

    @property
    def free(self) -> int:
        return self.capacity - len(self.holders)

    def free_seat(self, offer: Sequence[str]) -> str | None:
        held = self.seats()
        return next((r for r in offer if held.get(r, 0) < self.replicas[r]), None)

    def free_seats(self, offer: Sequence[str]) -> int:
        held = self.seats()
        return sum(max(0, self.replicas[r] - held.get(r, 0)) for r in offer)

    def purge(self) -> None:
        expired = [lease for lease, gone in self.holders.items() if gone]
        for lease in expired:
            del self.holders[lease]
            del self.tokens[lease]
            del self.placed[lease]
        for ticket in self.dead:
            self.waiters.remove(ticket)
            self.overtaken.discard(ticket)
        if expired or self.dead:
            self.version += 1
        self.dead = set()

    def grant(self, lease: str, replica: str) -> int:
        self.fence += 1
        self.holders[lease] = False
        self.tokens[lease] = self.fence
        self.placed[lease] = replica
        return self.fence

    def leave(self, ticket: str) -> None:
        self.waiters.remove(ticket)
        self.dead.discard(ticket)
        self.overtaken.discard(ticket)

    # -- what each script should do and answer ------------------------------------------

    def acquire(self, lease: str, offer: Sequence[str]) -> list[Any]:
        self.purge()
        replica = None if self.waiters else self.free_seat(offer)
        if replica is not None:
            token = self.grant(lease, replica)
            self.version += 1
            return [token, *self.counts(), replica]
        return [0, *self.counts(), ""]

    def enqueue(self, ticket: str, rank: int) -> list[Any]:
        self.purge()
        if len(self.waiters) >= self.queue_limit:
            victims = [t for t in self.waiters if self.ranks[t] == SHEDDABLE]
            if rank == SHEDDABLE or not victims:
                return [0, *self.counts()]
            self.leave(victims[-1])  # the newest of the lowest class
            self.shed.add(victims[-1])
        at = sum(self.ranks[t] <= rank for t in self.waiters)
        self.overtaken -= set(self.waiters[at:])  # a higher class may take their kept slot
        self.waiters.insert(at, ticket)
        self.ranks[ticket] = rank
        self.version += 1
        return [at + 1, *self.counts()]

    def poll(self, tickets: list[str], offer: Sequence[str]) -> tuple[list[Any], list[Any]]:
        """(version, holders, waiters, sheddable, seats), then status, value and replica
        per ticket."""
        self.purge()
        out: list[Any] = []
        grants = 0
        for ticket in tickets:
            if ticket in self.waiters:
                rank = self.waiters.index(ticket)
                replica = self.free_seat(offer)
                # every ticket ahead of it fits in the free seats offered too
                if rank < self.free_seats(offer) and replica is not None:
                    self.overtaken.update(self.waiters[:rank])
                    self.leave(ticket)
                    out += [1, self.grant(ticket, replica), replica]
                    grants += 1
                else:
                    out += [0, rank + 1, ""]
            elif ticket in self.tokens:  # granted already (a lost reply, re-asked)
                out += [1, self.tokens[ticket], self.placed[ticket]]
            elif ticket in self.shed:
                self.shed.discard(ticket)
                out += [-2, 0, ""]
            else:
                out += [-1, 0, ""]
        if grants:
            self.version += 1
        return self.counts(), out

    def renew(self, lease: str, replica: str) -> int:
        if lease in self.holders:
            self.holders[lease] = False  # its expiry moves on, even if it had passed
            return 1
        self.purge()
        if self.seats().get(replica, 0) < self.replicas[replica]:  # ahead of any waiter
            self.grant(lease, replica)
            self.version += 1
            self.reclaims += 1
            return 2
        return 0

    def release(self, lease: str) -> list[Any]:
        self.tokens.pop(lease, None)
        if self.holders.pop(lease, None) is not None:
            del self.placed[lease]
            self.version += 1
            return [1, *self.counts()]
        return [0, *self.counts()]

    def withdraw(self, ticket: str) -> list[Any]:
        if ticket in self.waiters:
            self.leave(ticket)
            self.version += 1
            return [1, *self.counts()]
        self.shed.discard(ticket)
        return [0, *self.counts()]
