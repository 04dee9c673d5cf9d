"""A local pool's `fair` line: within a priority class, the next slot goes to the tenant
with the least weighted tokens served on the pool, first come, first served within a
tenant (the rules: `policies.limits.fairness`).

`FairShares` keeps one pool's counters. A tenant that lines up with none of its own
waiting is lifted; a grant charges its prompt; a running answer counts the relay's tokens
so far (a tenant's live counter: its counter and its running answers' tokens, each over
its weight); a release folds in the answer's final count. `FairLine` is one class's line,
with `Line`'s face, so the pool's hand-off, shedding, withdrawals and resizes are the same
code for either order.

A waiter's position is its index in the class's grant order (`fairness.order`, from the
live counters, each waiter charged its expected tokens), worked out once for every waiter
of the class after each change of the pool, and again at most every FORECAST_TTL_S as the
running answers' tokens move the counters. A place may move back: a tenant served less
that lines up later goes first. No I/O.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable
from itertools import chain

from policies.limits.fairness import MAX_TENANTS, Counters, Waiter, expected_tokens, order, pick
from policies.slots.base import FORECAST_TTL_S, Clock, Share
from policies.slots.local_tickets import LocalLease, LocalTicket


def share_of(ticket: LocalTicket) -> Share:
    share = ticket.share
    assert share is not None, "a fair line gives every ticket a share"
    return share


class FairShares:
    """One pool's counters, its waiting tenants and the answers its tenants run."""

    __slots__ = ("_anonymous", "_by_tenant", "_charged", "_running", "_waiting", "clock",
                 "counters", "version")

    def __init__(self, clock: Clock, limit: int = MAX_TENANTS) -> None:
        self.counters = Counters(limit)
        self.clock = clock
        self.version = 0  # bumped by the pool at each change that may move places
        self._anonymous = itertools.count()
        self._waiting: dict[str, int] = {}  # tenant -> its waiters in the pool, every class
        self._running: dict[LocalLease, Share] = {}  # granted from the fair line, held now
        self._by_tenant: dict[str, dict[LocalLease, float]] = {}  # -> its leases' weights
        self._charged: dict[LocalLease, int] = {}  # output tokens told before the release

    def anonymous(self) -> Share:
        """The share of a waiter that came without one: a tenant of its own, weight 1."""
        return Share(f"\0{next(self._anonymous)}")

    def live(self, tenant: str) -> float:
        """Its counter and the tokens its running answers streamed so far (weighted)."""
        counter = self.counters.get(tenant)
        leases = self._by_tenant.get(tenant)
        if leases:
            counter += self._streamed(leases)
        return counter

    @staticmethod
    def _streamed(leases: dict[LocalLease, float]) -> float:
        streamed = 0.0
        for lease, weight in leases.items():
            produced = lease.progress.produced
            if produced is not None:
                streamed += produced.seen_events / weight
        return streamed

    def joined(self, share: Share) -> None:
        """A waiter of `share`'s tenant lined up (in any class)."""
        tenant = share.tenant
        waiting = self._waiting.get(tenant, 0)
        if not waiting:
            leases = self._by_tenant.get(tenant)
            self.counters.lift(tenant, [self.live(t) for t in self._waiting],
                               self._streamed(leases) if leases else 0.0)
        self._waiting[tenant] = waiting + 1

    def left(self, share: Share) -> None:
        """A waiter of `share`'s tenant left the line (granted, shed or gone)."""
        tenant = share.tenant
        waiting = self._waiting[tenant] - 1
        if waiting:
            self._waiting[tenant] = waiting
        else:
            del self._waiting[tenant]

    def granted(self, share: Share, lease: LocalLease) -> None:
        """`lease` was taken for `share`'s tenant, from the line or a free slot."""
        self.counters.charge(share.tenant, share.prompt_tokens, share.weight)
        self.counters.granted(share.tenant)
        self._running[lease] = share
        self._by_tenant.setdefault(share.tenant, {})[lease] = share.weight

    def charged(self, lease: LocalLease, output_tokens: int) -> None:
        if lease in self._running:
            self._charged[lease] = output_tokens

    def released(self, lease: LocalLease) -> None:
        """Fold the answer's tokens into its tenant's counter: the count told by `charge`,
        else the relay's. A lease granted before the line turned fair charges no one."""
        share = self._running.pop(lease, None)
        if share is None:
            return
        leases = self._by_tenant[share.tenant]
        del leases[lease]
        if not leases:
            del self._by_tenant[share.tenant]
        tokens = self._charged.pop(lease, None)
        if tokens is None:
            produced = lease.progress.produced
            tokens = 0 if produced is None else produced.seen_events
        self.counters.charge(share.tenant, tokens, share.weight)
        self.counters.trim(chain(self._waiting, self._by_tenant))


class FairLine:
    """One class's fair line: `Line`'s face (`tickets` in arrival order, `pop_head` the
    next to serve, `pop_tail` the newest, `remove`, `position`)."""

    __slots__ = ("_at", "_next", "_order", "_places", "_queues", "_shares", "_version",
                 "tickets")

    def __init__(self, shares: FairShares) -> None:
        self.tickets: OrderedDict[LocalTicket, None] = OrderedDict()  # in arrival order
        self._queues: dict[str, OrderedDict[LocalTicket, None]] = {}  # each tenant's
        self._shares = shares
        self._next = 0
        self._order: list[LocalTicket] = []  # the grant order, as last worked out
        self._places: dict[LocalTicket, int] | None = None  # its index in `_order`
        self._version, self._at = -1, 0.0

    def __len__(self) -> int:
        return len(self.tickets)

    def append(self, ticket: LocalTicket) -> None:
        if ticket.share is None:
            ticket.share = self._shares.anonymous()
        ticket.seq, self._next = self._next, self._next + 1
        self._shares.joined(ticket.share)
        self.tickets[ticket] = None
        self._queues.setdefault(ticket.share.tenant, OrderedDict())[ticket] = None
        self._places = None

    def pop_head(self) -> LocalTicket:
        """The first waiter of the tenant served least (`fairness.pick`)."""
        live = self._shares.live
        heads = [(tenant, next(iter(queue)).seq) for tenant, queue in self._queues.items()]
        tenant = pick(heads, {t: live(t) for t in self._queues})
        assert tenant is not None, "the pool pops only a line with waiters"
        ticket = next(iter(self._queues[tenant]))
        self._drop(ticket)
        return ticket

    def pop_tail(self) -> LocalTicket:
        ticket = next(reversed(self.tickets))
        self._drop(ticket)
        return ticket

    def remove(self, ticket: LocalTicket) -> bool:
        if ticket not in self.tickets:
            return False
        self._drop(ticket)
        return True

    def _drop(self, ticket: LocalTicket) -> None:
        share = share_of(ticket)
        del self.tickets[ticket]
        queue = self._queues[share.tenant]
        del queue[ticket]
        if not queue:
            del self._queues[share.tenant]
        self._shares.left(share)
        self._places = None

    def position(self, ticket: LocalTicket) -> int:
        """1 for the next to be served; 0 when not in this line."""
        if ticket not in self.tickets:
            return 0
        return self._ranked()[ticket] + 1

    def in_order(self) -> Iterable[LocalTicket]:
        """The waiters in their grant order, as the counters stand."""
        self._ranked()
        return self._order

    def _ranked(self) -> dict[LocalTicket, int]:
        shares = self._shares
        now = shares.clock()
        places = self._places
        if (places is None or self._version != shares.version
                or now - self._at > FORECAST_TTL_S):
            tickets = list(self.tickets)
            waiters = [Waiter(s.tenant, s.weight, expected_tokens(s.prompt_tokens, t.max_tokens))
                       for t, s in ((t, share_of(t)) for t in tickets)]
            live = {tenant: shares.live(tenant) for tenant in self._queues}
            self._order = [tickets[i] for i in order(waiters, live)]
            places = self._places = {t: i for i, t in enumerate(self._order)}
            self._version, self._at = shares.version, now
        return places
