"""The reference model of a `fair` shared pool's scripts (policies/slots/lua_fair.py): the
FIFO model (tests/support/lua_model.py) with each class's line in the order of
`policies.limits.fairness` and the tenants' counters kept by its `Counters`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.limits.fairness import Counters, Waiter, order
from tests.support.lua_model import Model

CLASSES = 3


@dataclass(frozen=True)
class Owner:
    """A ticket's or lease's share, as ENQUEUE was given it."""

    tenant: str
    weight: float
    prompt: int
    expected: int


@dataclass
class FairModel(Model):
    kept: int = 4  # counters kept
    places: int = 2  # places of a class placed exactly
    counters: Counters = field(default_factory=Counters)
    owners: dict[str, Owner] = field(default_factory=dict)  # ticket or lease -> its share
    seqs: dict[str, int] = field(default_factory=dict)  # waiter -> its arrival number
    seq: int = 0

    def __post_init__(self) -> None:
        self.counters.limit = self.kept

    def purge(self) -> None:
        for lease, gone in self.holders.items():
            if gone:
                self.owners.pop(lease, None)
        for ticket in self.dead:
            self.owners.pop(ticket, None)
        super().purge()

    def line(self) -> dict[str, int]:
        """The index of KEYS[15]: 'rank|tenant' -> waiters."""
        return dict(Counter(f"{self.ranks[t]}|{self.owners[t].tenant}" for t in self.waiters))

    def members(self) -> set[str]:
        return {f"{self.ranks[t]}|{self.owners[t].tenant}|{self.seqs[t]:013d}|{t}"
                for t in self.waiters}

    def fair_order(self) -> list[tuple[int, list[str]]]:
        """Each class's waiters (by rank) in their fair order."""
        out = []
        for rank in range(CLASSES):
            line = [t for t in self.waiters if self.ranks[t] == rank]
            waiters = [Waiter(self.owners[t].tenant, self.owners[t].weight,
                              self.owners[t].expected) for t in line]
            out.append((rank, [line[i] for i in order(waiters, self.counters.served)]))
        return out

    def places_of(self) -> dict[str, int]:
        """Each waiter's reported place: exact within `places` of its class, else its FIFO
        rank (at least the class's first place beyond)."""
        place, before = {}, 0
        for _, line in self.fair_order():
            for k, ticket in enumerate(line, 1):
                place[ticket] = before + k if k <= self.places else max(
                    self.waiters.index(ticket) + 1, before + self.places + 1)
            before += len(line)
        return place

    def leave(self, ticket: str) -> None:
        super().leave(ticket)
        self.seqs.pop(ticket, None)

    # -- the scripts -------------------------------------------------------------------

    def acquire_share(self, lease: str, offer: Sequence[str], owner: Owner | None
                      ) -> list[Any]:
        reply = self.acquire(lease, offer)
        if reply[0] and owner is not None:  # a newcomer's prompt counts, line or not
            self.owners[lease] = owner
            self.counters.charge(owner.tenant, owner.prompt, owner.weight)
            self.counters.granted(owner.tenant)
        return reply

    def enqueue_share(self, ticket: str, rank: int, owner: Owner) -> list[Any]:
        self.purge()
        if len(self.waiters) >= self.queue_limit:
            victims = [t for t in self.waiters if self.ranks[t] == 2]
            if rank == 2 or not victims:
                return [0, *self.counts()]
            self.leave(victims[-1])
            del self.owners[victims[-1]]
            self.shed.add(victims[-1])
        waiting = {self.owners[t].tenant for t in self.waiters}
        if owner.tenant not in waiting:  # no credit for time idle
            self.counters.lift(owner.tenant, [self.counters.get(t) for t in waiting])
        self.seq += 1
        at = sum(self.ranks[t] <= rank for t in self.waiters)
        self.waiters.insert(at, ticket)
        self.ranks[ticket], self.seqs[ticket], self.owners[ticket] = rank, self.seq, owner
        self.counters.trim(o.tenant for o in self.owners.values())
        self.version += 1
        return [self.places_of()[ticket], *self.counts()]

    def poll(self, tickets: list[str], offer: Sequence[str]) -> tuple[list[Any], list[Any]]:
        self.purge()
        free = self.free_seats(offer)
        chosen: set[str] = set()
        before = 0
        for _, line in self.fair_order():
            chosen.update(line[:min(len(line), max(0, free - before))])
            before += len(line)
        place = self.places_of()
        out: list[Any] = []
        grants = 0
        for ticket in tickets:
            if ticket in self.waiters and ticket in chosen:
                replica = self.free_seat(offer)
                assert replica is not None
                self.leave(ticket)
                out += [1, self.grant(ticket, replica), replica]
                owner = self.owners[ticket]
                self.counters.charge(owner.tenant, owner.prompt, owner.weight)
                self.counters.granted(owner.tenant)
                grants += 1
            elif ticket in self.waiters:
                out += [0, place[ticket], ""]
            elif ticket in self.tokens:
                out += [1, self.tokens[ticket], self.placed[ticket]]
            elif ticket in self.shed:
                self.shed.discard(ticket)
                out += [-2, 0, ""]
            else:
                out += [-1, 0, ""]
        for i in range(0, len(out), 3):
            if out[i] == 0:
                out[i + 1] -= grants
        if grants:
            self.version += 1
        return self.counts(), out

    def renew_charging(self, lease: str, replica: str, tokens: int) -> int:
        if lease in self.holders and lease in self.owners and tokens > 0:
            owner = self.owners[lease]
            self.counters.charge(owner.tenant, tokens, owner.weight)
        return self.renew(lease, replica)

    def release_charging(self, lease: str, tokens: int) -> list[Any]:
        owner = self.owners.pop(lease, None)
        if lease in self.holders and owner is not None and tokens > 0:
            self.counters.charge(owner.tenant, tokens, owner.weight)
        return self.release(lease)

    def withdraw(self, ticket: str) -> list[Any]:
        if ticket in self.waiters:
            del self.owners[ticket]
        return super().withdraw(ticket)
