"""LocalSlotPool: one backend's slots and queue inside one process.

`SlotPool` (`policies.slots.base`) is the role; `LocalSlotPool` is the in-process
mechanism (asyncio, one event loop). The backend is a group of replicas, each with its own
slots, behind one queue ordered by priority class, then FIFO within a class. A release
hands the slot (on the replica that freed it) straight to the first live waiter: no
polling, no wake-all, no barging. When the queue is full, a newcomer of a higher class
takes the place of the newest `sheddable` waiter, who is told so (`QueueShed`). With
`order_by(QueueOrder.FAIR)` each class's line is shared fairly between tenants instead
(`policies.slots.fair`): the same hand-off, with the tenant served least first. Its
leases and tickets: `policies.slots.local_tickets`; its waiters pinned to a replica:
`policies.slots.local_pins`. No I/O.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from policies.clock.answers import AnswerModel, Rates
from policies.clock.forecast import line_starts
from policies.clock.holds import HoldTimeModel
from policies.config import Priority, QueueOrder
from policies.fleet.warmup import Warmup, cold_line
from policies.slots.base import (
    FORECAST_TTL_S,
    SHEDDABLE,
    Clock,
    PoolSnapshot,
    QueueShed,
    Seats,
    Share,
)
from policies.slots.deadlines import Deadlines
from policies.slots.fair import FairLine, FairShares, share_of
from policies.slots.line import Line
from policies.slots.local_pins import Lines, PinnedWaiters
from policies.slots.local_tickets import LocalLease, LocalTicket
from policies.slots.seating import Seat

__all__ = ["LocalLease", "LocalSlotPool", "LocalTicket"]


class LocalSlotPool:
    """`capacity` slots (over `replicas`, a group of one by default) and a queue of at most
    `queue_limit` tickets, by class, then FIFO (or fair between tenants: `order_by`)."""

    def __init__(
        self,
        name: str,
        capacity: int,
        queue_limit: int,
        estimator: HoldTimeModel,
        clock: Clock = time.monotonic,
        replicas: Mapping[str, int] | None = None,
        answers: AnswerModel | None = None,
    ) -> None:
        self.name = name
        # A slot freed on a replica may go to one of the first `look_ahead` waiters of the
        # class served next that wants that replica, none passed over more than
        # `max_bypass` times; 0: strictly first come, first served (or fair: a fair line
        # takes no look-ahead, as serving by replica would undo its order).
        self.look_ahead, self.max_bypass = 0, 2
        # Waiters may be pinned to a replica for a while (`enqueue(hold_s=...)`): a grouped
        # pool with a FIFO line (a fair line's order is its own). `_pinned`: those that are.
        self.pins = len(replicas or ()) > 1
        self._pinned = PinnedWaiters(self)
        self._seats = {r: Seat(n) for r, n in
                       (replicas if replicas is not None else {name: capacity}).items()}
        self.cold: Warmup | None = None  # a discovered group's, while none is ready
        self.capacity = self._healthy_slots()
        self.queue_limit = queue_limit
        self.estimator = estimator  # holding times: the forecast's fallback, and the mean
        self.answers = answers or AnswerModel()  # the backend's answers: the forecast
        self.clock = clock
        self.active = 0
        # One line per priority class, served in class order: FIFO, or fair (`_fair`: the
        # counters of the tenants it is fair between).
        self._lines: Lines = tuple(Line() for _ in Priority)
        self._fair: FairShares | None = None
        self._watchers: list[Callable[[LocalSlotPool], None]] = []
        self._leases: dict[LocalLease, float] = {}  # held now -> granted at
        self._change: asyncio.Future[None] | None = None
        self._move: asyncio.Future[None] | None = None
        # Every waiter re-reads its ETA after each change: one forecast per position serves
        # them all until the next change (or FORECAST_TTL_S, as the running leases age).
        self._forecasts: dict[int, float] = {}
        self._forecast_at = 0.0
        self.deadlines = Deadlines()  # its waiters' (one timer for all)

    @property
    def queued(self) -> int:
        critical, standard, sheddable = self._lines  # on every admission: no generator
        return len(critical.tickets) + len(standard.tickets) + len(sheddable.tickets)

    async def recount(self) -> None:
        """Its counts are its own: nothing to read."""

    def snapshot(self) -> PoolSnapshot:
        return PoolSnapshot(
            self.name,
            self.capacity,
            self.active if len(self._seats) == 1 else self._healthy_active(),
            self.queued,
            self.queue_limit,
            self.estimator.mean_s,
            len(self._lines[SHEDDABLE]),
            self._pinned.count,
        )

    def forecast(self, position: int) -> float:
        """Expected seconds until the ticket at `position` (1 = next) gets a slot."""
        now = self.clock()
        if now - self._forecast_at > FORECAST_TTL_S:
            self._forecasts.clear()
            self._forecast_at = now
        cached = self._forecasts.get(position)
        if cached is None:  # one run for every place in line: each waiter asks for its own
            # and for as many places again: newcomers at the back find theirs made
            running = [lease.progress.running(now - granted)
                       for lease, granted in self._leases.items()]
            waiting = [t.max_tokens for line in self._lines for t in line.in_order()]
            capacity, warmup_s = self.capacity, 0.0
            if not capacity and self.cold is not None:  # none ready: after the warm-up
                capacity, warmup_s = cold_line(capacity, self.cold, now)
            waits = line_starts(self.answers, self.estimator, running, capacity,
                                waiting, 2 * max(position, self.queued))
            if warmup_s:
                waits = [wait + warmup_s for wait in waits]
            self._forecasts.update(enumerate(waits, 1))
            cached = waits[position - 1]
        return cached

    def next_change(self) -> asyncio.Future[None]:
        """A future resolved at the next change of active or queued (one for all waiters)."""
        if self._change is None or self._change.done():
            self._change = asyncio.get_running_loop().create_future()
        return self._change

    def next_move(self) -> asyncio.Future[None]:
        """Resolved when a waiter's place may have changed: someone ahead left or was
        served, or a newcomer of a higher class lined up (not at an arrival at the back)."""
        if self._move is None or self._move.done():
            self._move = asyncio.get_running_loop().create_future()
        return self._move

    def watch(self, callback: Callable[[LocalSlotPool], None]) -> Callable[[], None]:
        """Call `callback(pool)` after every change of active or queued; returns an unwatch."""
        self._watchers.append(callback)
        return lambda: self._watchers.remove(callback)

    def tenants(self) -> dict[str, int]:
        """Its waiters by tenant (one without a share: ""), for the dashboard."""
        counts: dict[str, int] = {}
        for line in self._lines:
            for ticket in line.tickets:
                tenant = "" if ticket.share is None else ticket.share.tenant
                counts[tenant] = counts.get(tenant, 0) + 1
        return counts

    def seats(self) -> tuple[Seats, ...]:
        return tuple(Seats(name, seat.slots, seat.active, seat.healthy)
                     for name, seat in self._seats.items())

    def set_healthy(self, replica: str, healthy: bool) -> None:
        """An unhealthy replica's slots leave the capacity; back, they serve the line."""
        seat = self._seats.get(replica)
        if seat is None or seat.healthy == healthy:
            return
        seat.healthy = healthy
        self.capacity = self._healthy_slots()
        self._fill(self.clock(), ())
        self._changed()

    def resize(self, capacity: int, queue_limit: int,
               replicas: Mapping[str, int] | None = None,
               unready: Collection[str] = ()) -> None:
        """New limits for new admissions. Leases held stay valid (a smaller pool admits
        no one until enough are released; a removed replica runs out what it holds); a
        larger one serves its waiters at once. A replica in `unready` (found again, or
        new) is out of service until `set_healthy` (its first health check)."""
        wanted = replicas if replicas is not None else {next(iter(self._seats)): capacity}
        for name in list(self._seats):
            if name not in wanted:
                self._seats[name].slots = 0
                if not self._seats[name].active:
                    del self._seats[name]
        for name, slots in wanted.items():
            seat = self._seats.setdefault(name, Seat(slots))
            seat.slots, seat.healthy = slots, seat.healthy and name not in unready
        self.capacity, self.queue_limit = self._healthy_slots(), queue_limit
        self._fill(self.clock(), ())
        self._changed()

    def order_by(self, order: QueueOrder) -> None:
        """Serve each class first come, first served, or fair between tenants. A switch with
        waiters rebuilds the lines in arrival order (each waiter keeps its tenant; a
        switch to fair starts every tenant's counter afresh, and the answers running then
        are charged to no one); the next grant follows the new order."""
        if (order is QueueOrder.FAIR) == (self._fair is not None):
            return
        self._fair = FairShares(self.clock) if order is QueueOrder.FAIR else None
        for line in self._lines:  # a fair line's order is its own: no pins
            for ticket in list(line.tickets):
                self._pinned.unpin(ticket)
        waiting = [list(line.tickets) for line in self._lines]  # in arrival order
        fair = self._fair
        self._lines = (tuple(Line[LocalTicket]() for _ in Priority) if fair is None
                       else tuple(FairLine(fair) for _ in Priority))
        for rank, tickets in enumerate(waiting):
            for ticket in tickets:
                self._lines[rank].append(ticket)
        self._changed()

    async def try_acquire(self, prefer: Sequence[str] = (),
                          share: Share | None = None) -> LocalLease | None:
        return self.acquire_nowait(prefer, share)

    def acquire_nowait(self, prefer: Sequence[str] = (),
                       share: Share | None = None) -> LocalLease | None:
        # Newcomers never overtake waiters: a slot is free while some wait only when every
        # one of them is pinned to another replica (`_fill` ran since).
        critical, standard, sheddable = self._lines  # (nobody waits: no call to count them)
        if (critical.tickets or standard.tickets or sheddable.tickets) \
                and self.queued > self._pinned.count:
            return None
        replica = self._free_seat(prefer)
        if replica is None:
            return None
        lease = self._take(replica, self.clock())
        if self._fair is not None and share is not None:  # served tokens count, line or not
            self._fair.granted(share, lease)
        self._changed()
        return lease

    async def enqueue(self, priority: Priority = Priority.STANDARD, want: str | None = None,
                      max_tokens: int | None = None, share: Share | None = None,
                      hold_s: float = 0.0, beyond: int = 0) -> LocalTicket | None:
        return self.enqueue_nowait(priority, want, max_tokens, share, hold_s, beyond)

    def enqueue_nowait(self, priority: Priority = Priority.STANDARD, want: str | None = None,
                       max_tokens: int | None = None, share: Share | None = None,
                       hold_s: float = 0.0, beyond: int = 0) -> LocalTicket | None:
        """A place in line; with `hold_s` > 0 it takes a slot on `want` alone for that
        long (a grouped FIFO pool: `pins`), then any, keeping its place."""
        rank = priority.rank
        if self.queued >= self.queue_limit + beyond:
            victims = self._lines[SHEDDABLE]
            if rank >= SHEDDABLE or not victims:
                return None
            victim = victims.pop_tail()  # the newest of the lowest class
            self._pinned.unpin(victim)
            if not victim._future.done():
                victim._future.set_exception(QueueShed())
        ticket = LocalTicket(self, asyncio.get_running_loop().create_future(), rank, want,
                             max_tokens, share)
        self._lines[rank].append(ticket)
        if hold_s > 0 and want in self._seats and self.pins and self._fair is None:
            self._pinned.pin(ticket, hold_s, self._unpin)
        # Places move only if it lined up ahead of someone (a lower class waits; in a fair
        # line, anyone of its class a tenant served more than its own).
        ahead = self._fair is not None or any(
            self._lines[lower] for lower in range(rank + 1, len(self._lines)))
        if self._free_seat(()) is not None:  # a free slot, an empty line: no release will come
            self._fill(self.clock(), ())
            ahead = True
        self._changed(moved=ahead)
        return ticket

    def _position(self, ticket: LocalTicket) -> int:
        within = self._lines[ticket.rank].position(ticket)
        if within == 0:
            return 0
        return within + sum(len(self._lines[rank]) for rank in range(ticket.rank))

    def _leave(self, ticket: LocalTicket) -> None:
        self._pinned.unpin(ticket)
        if self._lines[ticket.rank].remove(ticket):
            self._changed()

    def _unpin(self, ticket: LocalTicket) -> None:
        """`ticket`'s patience is over: it takes any replica from now on (a free one now)."""
        if self._pinned.unpin(ticket) and self._free_seat(()) is not None:
            self._fill(self.clock(), ())
            self._changed()

    def replica_wait(self, replica: str, rates: Rates | None = None) -> float:
        """Expected seconds until a slot on `replica` serves one more waiter pinned to it
        (behind those pinned to it already), at its own `rates` if given (else the pool's
        answers'); inf when it takes no work."""
        seat = self._seats.get(replica)
        if seat is None or not seat.healthy or not seat.slots:
            return math.inf
        now = self.clock()
        running = [lease.progress.running(now - granted)
                   for lease, granted in self._leases.items() if lease.replica == replica]
        waiting = self._pinned.pinned_to(replica)
        return line_starts(self.answers, self.estimator, running, seat.slots, waiting,
                           len(waiting) + 1, rates)[-1]

    def _release(self, lease: LocalLease) -> None:
        self._leases.pop(lease, None)
        seat = self._seats[lease.replica]
        seat.active -= 1
        self.active -= 1
        if self._fair is not None:  # its tokens counted before the next is picked
            self._fair.released(lease)
        if not seat.slots and not seat.active:  # a removed replica, run out
            del self._seats[lease.replica]
        critical, standard, sheddable = self._lines
        if critical.tickets or standard.tickets or sheddable.tickets:  # (usually nobody)
            self._fill(self.clock(), (lease.replica,))
        self._changed()

    def _fill(self, now: float, prefer: Sequence[str]) -> None:
        """Hand free slots (first on `prefer`'s replicas) to the first live waiters."""
        if self._pinned.count:
            self._pinned.fill(now, prefer)
            return
        for line in self._lines:
            while line:
                replica = self._free_seat(prefer)
                if replica is None:
                    return
                ticket = self._look_ahead(line, replica) if self.look_ahead else line.pop_head()
                if not ticket._future.done():  # skip tickets cancelled but not yet gone
                    lease = self._take(replica, now, ticket.max_tokens)
                    ticket._future.set_result(lease)
                    if self._fair is not None:
                        self._fair.granted(share_of(ticket), lease)

    def _takes(self, replica: str | None) -> bool:
        seat = self._seats.get(replica) if replica is not None else None
        return seat is not None and seat.healthy and seat.slots > 0

    def _free_seats(self, prefer: Sequence[str]) -> list[str]:
        """The replicas with a free slot, `prefer`'s first."""
        free = [name for name, seat in self._seats.items()
                if seat.healthy and seat.active < seat.slots]
        return sorted(free, key=lambda name: name not in prefer)

    def _look_ahead(self, line: Line[LocalTicket] | FairLine, replica: str) -> LocalTicket:
        """The first of the line's first `look_ahead` waiters that wants `replica`, unless a
        waiter ahead of it was passed over `max_bypass` times already; else the head."""
        ahead: list[LocalTicket] = []
        for seen, ticket in enumerate(line.tickets):
            if seen == self.look_ahead:
                break
            if ticket._future.done():
                continue  # gone: the head pops it
            if ticket.want == replica:
                for passed in ahead:
                    passed.bypassed += 1
                line.remove(ticket)
                return ticket
            if ticket.bypassed >= self.max_bypass:
                break
            ahead.append(ticket)
        return line.pop_head()

    def _take(self, replica: str, now: float, max_tokens: int | None = None) -> LocalLease:
        self._seats[replica].active += 1
        self.active += 1
        lease = LocalLease(self, now, replica, max_tokens)
        self._leases[lease] = now
        return lease

    def _free_seat(self, prefer: Sequence[str]) -> str | None:
        """The first replica with a free slot: of `prefer`, else in config order."""
        seats = self._seats
        for name in prefer:
            seat = seats.get(name)
            if seat is not None and seat.healthy and seat.active < seat.slots:
                return name
        for name, seat in seats.items():
            if seat.healthy and seat.active < seat.slots:
                return name
        return None

    def _healthy_slots(self) -> int:
        return sum(seat.slots for seat in self._seats.values() if seat.healthy)

    def _healthy_active(self) -> int:
        return sum(seat.active for seat in self._seats.values() if seat.healthy)

    def _changed(self, moved: bool = True) -> None:
        if moved:  # an arrival at the back changes no wait ahead of it
            self._forecasts.clear()
            if self._fair is not None:  # (nor, in a fifo line, any place)
                self._fair.version += 1
        if self._change is not None and not self._change.done():
            self._change.set_result(None)
        if moved and self._move is not None and not self._move.done():
            self._move.set_result(None)
        for callback in self._watchers:
            callback(self)
