"""RedisSlotPool: one backend's slots and queue (FIFO within a class, or `fair` between
tenants: `policies.slots.lua_fair`), shared by every process and replica.

Each atomic step is a Lua script (`policies.slots.lua`). Waiting does not poll Redis in a
loop: a release anywhere publishes a wake-up; each process holds one subscription
(`RedisCoordinator`, `policies.slots.coordinator`) and, for a pool with local waiters,
makes one POLL call that grants every local ticket whose place in line is within the free
slots, and refreshes the others' heartbeats and positions. A re-check every `recheck_s`
covers lost messages and keeps waiters alive. Leases have a TTL and are renewed every
TTL/3 by a task of their own; a replica that dies loses its slots and its place in line
within the TTL.

Every Redis call has a short timeout and goes through one circuit breaker per process.
Failures surface as `CoordinationError`; `policies.slots.failover` decides what a request
then gets. A call that timed out may still have happened: a release or withdrawal is
retried by id in the background, and POLL reports a grant whose reply was lost. The
leases and tickets it hands out are in `policies.slots.shared`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from policies.clock.answers import AnswerModel, Rates
from policies.clock.forecast import line_starts, seen_here
from policies.clock.holds import HoldTimeModel
from policies.config import Priority, QueueOrder
from policies.fleet.warmup import Warmup, cold_line
from policies.health.breaker import BreakerState
from policies.limits.fairness import MAX_TENANTS, expected_tokens
from policies.slots.base import (
    FORECAST_TTL_S,
    CoordinationError,
    PoolSnapshot,
    QueueShed,
    Seats,
    Share,
)
from policies.slots.coordinator import RETRIES, RedisCoordinator
from policies.slots.lua import KEY_NAMES, SHED, WAKING_KINDS
from policies.slots.lua_fair import FAIR_PLACES
from policies.slots.seating import GroupView, from_message, from_reply
from policies.slots.shared import RedisLease, RedisTicket

__all__ = ["RedisLease", "RedisSlotPool", "RedisTicket"]

log = logging.getLogger("slotgate.redis")


class RedisSlotPool:
    """`capacity` slots (over `replicas`, a group of one by default) and a line of at most
    `queue_limit`, kept in Redis: FIFO within a class, or `fair` between tenants
    (`policies.slots.lua_fair`)."""

    def __init__(self, name: str, capacity: int, queue_limit: int, estimator: HoldTimeModel,
                 coordinator: RedisCoordinator, lease_ttl_s: float, recheck_s: float,
                 clock: Callable[[], float] = time.monotonic,
                 replicas: Mapping[str, int] | None = None,
                 answers: AnswerModel | None = None,
                 queue_order: QueueOrder = QueueOrder.FIFO) -> None:
        self.name = name
        self.fair = queue_order is QueueOrder.FAIR
        prefix = "fair_" if self.fair else ""  # each step's script for this line
        self.script = {step: prefix + step for step in (
            "acquire", "enqueue", "poll", "renew", "release", "withdraw")}
        self.group = GroupView(replicas if replicas is not None else {name: capacity})
        self.cold: Warmup | None = None  # a discovered group's, while none is ready here
        self.capacity = self.group.capacity
        self.queue_limit = queue_limit
        self.estimator = estimator
        self.answers = answers or AnswerModel()
        self.mine: set[RedisLease] = set()  # leases held by this process: progress seen
        self.coordinator = coordinator
        self.lease_ttl_s = lease_ttl_s
        self.ttl_ms = int(lease_ttl_s * 1000)
        self.recheck_s = recheck_s
        self.clock = clock
        tag = f"{{{coordinator.prefix}:{name}}}"  # one hash slot for all of this pool's keys
        self.keys = [f"{tag}:{key}" for key in KEY_NAMES]
        self.channel = f"{tag}:wake"
        coordinator.pools[self.channel.encode()] = self
        self.active = 0  # as Redis last said, in a reply or a wake-up
        self.queued = 0
        self.sheddable = 0  # of `queued`
        self.version = 0
        self._ages: list[float] = []
        self._ages_at = 0.0
        self._tickets: dict[str, RedisTicket] = {}
        self._watchers: list[Callable[[RedisSlotPool], None]] = []
        self._change: asyncio.Future[None] | None = None
        self._wake = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None
        self._forecasts: dict[int, float] = {}
        self._forecast_at = 0.0

    # -- the SlotPool role --------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        active = self.active - self.group.held_on_unhealthy  # those run outside capacity
        return PoolSnapshot(self.name, self.capacity, active, self.queued,
                            self.queue_limit, self.estimator.mean_s, self.sheddable)

    pins = False  # its line is shared: a waiter takes the first slot freed in the group

    def replica_wait(self, replica: str, rates: Rates | None = None) -> float:
        """The group's next slot at the group's rates: a shared line pins no one (the
        hold is never asked), and the leases of other processes are seen by their age
        alone, not by replica, so a replica's own `rates` would have nothing to apply to."""
        return self.forecast(1)

    def forecast(self, position: int) -> float:
        if self.clock() - self._forecast_at > FORECAST_TTL_S:
            self._forecasts.clear()
            self._forecast_at = self.clock()
        cached = self._forecasts.get(position)
        if cached is None:  # one run for the line; others' leases by their age alone
            now = self.clock()
            ages = [a + now - self._ages_at for a in self._ages]
            running = seen_here(ages, [(now - m.granted_at, m.progress) for m in self.mine],
                                self.active)
            waiting: list[int | None] = [None] * self.queued
            for t in self._tickets.values():
                if 0 < t.position <= len(waiting):
                    waiting[t.position - 1] = t.max_tokens
            capacity, warmup_s = self.capacity, 0.0
            if not capacity and self.cold is not None:  # none ready: after the warm-up
                capacity, warmup_s = cold_line(capacity, self.cold, now)
            waits = line_starts(self.answers, self.estimator, running, capacity,
                                waiting, max(position, self.queued))
            if warmup_s:
                waits = [wait + warmup_s for wait in waits]
            self._forecasts.update(enumerate(waits, 1))
            cached = waits[position - 1]
        return cached

    def next_change(self) -> asyncio.Future[None]:
        if self._change is None or self._change.done():
            self._change = asyncio.get_running_loop().create_future()
        return self._change

    def next_move(self) -> asyncio.Future[None]:
        return self.next_change()  # places come from POLL replies, which follow changes

    def watch(self, callback: Callable[[RedisSlotPool], None]) -> Callable[[], None]:
        self._watchers.append(callback)
        return lambda: self._watchers.remove(callback)

    def seats(self) -> tuple[Seats, ...]:
        return self.group.seats()

    def set_healthy(self, replica: str, healthy: bool) -> None:
        """This process's view: an unhealthy replica is offered to no script, and its
        slots leave the capacity; back, its seats serve the line here."""
        if self.group.set_healthy(replica, healthy):
            self.resize(self.capacity, self.queue_limit, self.group.slots)

    def resize(self, capacity: int, queue_limit: int,
               replicas: Mapping[str, int] | None = None,
               unready: Collection[str] = ()) -> None:
        """New limits, passed to every script from now on; waiters here re-check. A
        removed replica runs out what it holds; a new one in `unready` is offered to no
        script until `set_healthy` (its first health check here)."""
        self.group.resize(replicas if replicas is not None
                          else {next(iter(self.group.slots)): capacity}, unready)
        self.capacity, self.queue_limit = self.group.capacity, queue_limit
        self._forecasts.clear()
        self.wake()

    async def try_acquire(self, prefer: Sequence[str] = (),
                          share: Share | None = None) -> RedisLease | None:
        lease_id = _new_id()
        args: list[str | int | float] = [lease_id, self.ttl_ms, self.channel]
        if self.fair:  # its tenant ('': none, charged nothing), weight and prompt
            args += ["", 1, 0] if share is None else [
                _tenant(share), share.weight, share.prompt_tokens]
        try:
            token, *counts, replica = await self.coordinator.call(
                self.script["acquire"], self.keys, [*args, *self.group.offer(prefer)])
        except CoordinationError:
            self.coordinator.in_background(lambda: self.release_id(lease_id))  # it may exist
            raise
        self._state(*counts)
        return RedisLease(self, lease_id, token, replica.decode()) if token else None

    async def enqueue(self, priority: Priority = Priority.STANDARD,
                      want: str | None = None,
                      max_tokens: int | None = None,
                      share: Share | None = None, hold_s: float = 0.0,
                      beyond: int = 0) -> RedisTicket | None:
        ticket_id = _new_id()
        args: list[str | int | float] = [self.queue_limit + beyond, ticket_id, self.ttl_ms,
                                         self.channel, priority.rank]
        if self.fair:  # its tenant, weight, prompt and expected tokens
            share = share or Share(ticket_id)
            args += [_tenant(share), share.weight, share.prompt_tokens,
                     expected_tokens(share.prompt_tokens, max_tokens), MAX_TENANTS,
                     FAIR_PLACES]
        try:
            position, *counts = await self.coordinator.call(
                self.script["enqueue"], self.keys, args)
        except CoordinationError:
            self.coordinator.in_background(lambda: self.withdraw_id(ticket_id))
            raise
        self._state(*counts)
        if not position:
            return None
        ticket = RedisTicket(self, ticket_id, position, max_tokens)
        self._tickets[ticket_id] = ticket
        self.wake()  # a slot may have freed between the admission and the enqueue
        return ticket

    # -- waiting --------------------------------------------------------------------------

    def heard(self, message: bytes) -> None:
        """A change announced on the pool's channel (`policies.slots.lua` has its format)."""
        try:
            kind, version, active, queued, shed, seats = message.split(b":")
            self._state(int(version), int(active), int(queued), int(shed), from_message(seats))
        except ValueError:
            log.debug("ignored a malformed wake-up on %s: %r", self.channel, message[:64])
            return
        if kind in WAKING_KINDS:
            self.wake()

    def wake(self) -> None:
        """Something changed in Redis: waiters here re-check (one POLL for all of them)."""
        if self._tickets:
            self._wake.set()
            if self._poller is None or self._poller.done():
                self._poller = asyncio.create_task(self._poll_while_waiting())
        for callback in self._watchers:  # e.g. move offers waiting for a free slot here
            callback(self)

    async def _poll_while_waiting(self) -> None:
        while self._tickets:
            self._wake.clear()
            try:
                await self._poll()
            except CoordinationError as exc:
                self._fail_if_open(exc)
            if not self._tickets:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.recheck_s):  # the safety net: lost wake-ups
                    await self._wake.wait()

    async def _poll(self) -> None:
        tickets = list(self._tickets.values())
        offer = self.group.offer()
        places = [FAIR_PLACES] if self.fair else []
        reply = await self.coordinator.call(
            self.script["poll"], self.keys, [self.ttl_ms, self.channel, *places,
                                             len(offer) // 2, *offer, *(t.id for t in tickets)])
        version, active, queued, sheddable, now_ms, granted, seats = reply[:7]
        self._ages = [(int(now_ms) - float(g)) / 1000 for g in granted]
        self._ages_at = self.clock()
        moved = False
        for i, ticket in enumerate(tickets):
            status, value, replica = reply[7 + 3 * i: 10 + 3 * i]
            if status == 1:
                lease = RedisLease(self, ticket.id, value, replica.decode(), ticket.max_tokens)
                self._tickets.pop(ticket.id, None)
                ticket.position = 0  # out of the line, as a local ticket says
                if ticket.future.done():  # it left meanwhile: give the slot back
                    self.coordinator.in_background(lease.release)
                else:
                    ticket.future.set_result(lease)
            elif status == 0:
                moved |= ticket.position != value
                ticket.position = value
            elif status == SHED:  # a higher class took its place
                self._tickets.pop(ticket.id, None)
                ticket.position = 0
                if not ticket.future.done():
                    ticket.future.set_exception(QueueShed())
            else:  # expired in Redis (this process was cut off past the TTL)
                self._tickets.pop(ticket.id, None)
                if not ticket.future.done():
                    ticket.future.set_exception(CoordinationError("place in line expired"))
        self._state(version, active, queued, sheddable, from_reply(seats), moved)

    def _fail_if_open(self, exc: CoordinationError) -> None:
        """With the breaker open, waiting here is waiting for nothing: tell the waiters."""
        if self.coordinator.breaker.state is BreakerState.CLOSED:
            return
        for ticket in list(self._tickets.values()):
            self._tickets.pop(ticket.id, None)
            if not ticket.future.done():
                ticket.future.set_exception(CoordinationError(str(exc)))
            self.coordinator.in_background(functools.partial(self.withdraw_id, ticket.id))

    def forget(self, ticket: RedisTicket) -> None:
        self._tickets.pop(ticket.id, None)

    # -- by id, retried: a timed-out call may have happened ---------------------------------

    async def release_id(self, lease_id: str, tokens: int = 0) -> None:
        """`tokens`: its answer's tokens not charged yet (a `fair` line's). A first call
        that fails is retried in the background: the answer whose slot it was does not
        wait on Redis (through a blip it would, up to the lease's TTL)."""
        more = [tokens] if self.fair else []
        try:
            _, *counts = await self.coordinator.call(
                self.script["release"], self.keys, [lease_id, self.channel, *more])
        except CoordinationError:
            self.coordinator.in_background(lambda: self._retried("release", lease_id, *more))
            return
        self._state(*counts)

    async def withdraw_id(self, ticket_id: str) -> None:
        """Leave the line; if the ticket was granted meanwhile, release that lease."""
        if not await self._retried("withdraw", ticket_id):
            await self.release_id(ticket_id)  # same id: a no-op when never granted

    async def _retried(self, step: str, item: str, *more: int) -> int:
        script = self.script[step]
        for attempt in range(RETRIES):
            try:
                done, *counts = await self.coordinator.call(
                    script, self.keys, [item, self.channel, *more])
            except CoordinationError:
                await self._until_answering(self.recheck_s * (attempt + 1))
                continue
            self._state(*counts)
            return int(done)
        log.warning("%s of %s on %s failed; Redis expires it within %g s", script, item,
                    self.name, self.lease_ttl_s)
        self.coordinator.in_background(self._recount)
        return 0

    async def _recount(self) -> None:
        """The counts here still hold what could not be given back: read them again once
        Redis has expired it (the next poll would, but a pool nobody waits on polls not)."""
        await asyncio.sleep(self.lease_ttl_s)  # the item's TTL: gone in Redis by then
        await self.recount()

    async def recount(self) -> None:
        """Redis's counts now (its poll expires lapsed leases first)."""
        with contextlib.suppress(CoordinationError):
            await self._poll()

    async def _until_answering(self, backoff_s: float) -> None:
        """Wait to retry: while the breaker is open, until Redis answers again (at most
        the lease TTL: past it Redis has expired the item anyway); else `backoff_s`."""
        healthy = self.coordinator.healthy
        with contextlib.suppress(TimeoutError):
            if healthy.is_set():
                await asyncio.sleep(backoff_s)  # a failed call, breaker still closed
            else:
                async with asyncio.timeout(self.lease_ttl_s):
                    await healthy.wait()

    def _state(self, version: int, active: int, queued: int, sheddable: int,
               seats: Sequence[bytes] | dict[str, int], moved: bool = False) -> None:
        """Take Redis's counts unless older than those already heard; tell watchers and
        waiters if they (or a position here) changed."""
        version = int(version)
        held = seats if isinstance(seats, dict) else from_reply(seats)
        if version < self.version:  # a late reply: keep the newer counts
            active, queued, sheddable = self.active, self.queued, self.sheddable
            held = self.group.held
        self.version = max(self.version, version)
        active, queued = max(0, int(active)), max(0, int(queued))
        sheddable = max(0, int(sheddable))
        if (active, queued, sheddable) == (self.active, self.queued, self.sheddable) \
                and held == self.group.held and not moved:
            return
        self.active, self.queued, self.sheddable = active, queued, sheddable
        self.group.held = held
        self._forecasts.clear()
        if self._change is not None and not self._change.done():
            self._change.set_result(None)
        for callback in self._watchers:
            callback(self)


def _new_id() -> str:
    return os.urandom(9).hex()


def _tenant(share: Share) -> str:
    """A tenant as the fair scripts key it: its UTF-8 in hex (no '|'), '-' for ''."""
    return share.tenant.encode().hex() or "-"
