"""What a shared (Redis) pool hands out: `RedisLease`, a slot held in Redis and renewed
every TTL/3 until released, and `RedisTicket`, a place in the shared line granted by the
pool's POLL calls. The pool itself is `policies.slots.redis`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from policies.clock.forecast import Progress
from policies.clock.holds import HoldTimeModel
from policies.slots.base import CoordinationError, QueueTimeout
from policies.slots.coordinator import RedisCoordinator
from policies.slots.seating import GroupView

log = logging.getLogger("slotgate.redis")


class SharedPool(Protocol):
    """What a lease and a ticket use of their pool (`RedisSlotPool`, `policies.slots.redis`)."""

    name: str
    clock: Callable[[], float]
    coordinator: RedisCoordinator
    estimator: HoldTimeModel
    group: GroupView
    keys: list[str]
    channel: str
    lease_ttl_s: float
    ttl_ms: int
    recheck_s: float
    mine: set[RedisLease]  # the leases held in this process
    fair: bool  # a `fair` line: leases charge their answers' tokens
    script: dict[str, str]  # each step's script

    async def release_id(self, lease_id: str, tokens: int = 0) -> None: ...

    async def withdraw_id(self, ticket_id: str) -> None: ...

    def forget(self, ticket: RedisTicket) -> None: ...

    def forecast(self, position: int) -> float: ...


class RedisLease:
    """A slot held in Redis, renewed every TTL/3 until released. In a `fair` line each
    renewal charges its tenant the answer's tokens relayed since the last one, and the
    release the rest (up to `charge`'s count when given, else the relay's)."""

    def __init__(self, pool: SharedPool, lease_id: str, token: int, replica: str,
                 max_tokens: int | None = None) -> None:
        self._pool = pool
        self.id = lease_id
        self.token = token  # fencing: larger than every token granted before it
        self.replica = replica  # the engine replica it runs on
        self.granted_at = pool.clock()
        self.released = False
        self.progress = Progress(max_tokens)  # seen by this process's forecasts only
        self.charged = 0  # its answer's tokens charged so far (a `fair` line's)
        self.final: int | None = None  # its answer's tokens, counted at its end
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._renewing = False  # a renewal call is in flight
        self._renewer = asyncio.create_task(self._renew(), name=f"renew-{lease_id}")
        pool.mine.add(self)

    @property
    def pool(self) -> str:
        return self._pool.name

    @property
    def held_s(self) -> float:
        return self._pool.clock() - self.granted_at

    def lost(self) -> asyncio.Future[None]:
        """Resolved if Redis no longer counts this lease (it expired and its slot was taken)."""
        return self._lost

    def follow(self, progress: Progress) -> None:
        self.progress = progress

    def charge(self, output_tokens: int) -> None:
        self.final = output_tokens

    def produced(self) -> int:
        """Its answer's tokens so far: the relay's count (a stream's), or 0."""
        produced = self.progress.produced
        return 0 if produced is None else produced.seen_events

    async def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self._renewing:
            # Redis must run that renewal before this release: run after it, a renewal
            # grants the slot again (it restores leases lost in an outage), and nobody
            # would release it before its TTL. It ends on its own once its call has.
            await asyncio.wait([self._renewer], timeout=self._pool.coordinator.cap_s)
        self._renewer.cancel()
        self._pool.mine.discard(self)
        if not self._pool.fair:
            await self._pool.release_id(self.id)
            return
        final = self.produced() if self.final is None else self.final
        await self._pool.release_id(self.id, max(0, final - self.charged))

    async def _renew(self) -> None:
        pool = self._pool
        every = period = pool.lease_ttl_s / 3
        while not self.released:
            await asyncio.sleep(period)  # the renewal period itself
            args: list[str | int] = [self.id, pool.ttl_ms, pool.group.slots.get(self.replica, 0),
                                     pool.channel, self.replica]
            seen = self.produced() if pool.fair else 0
            if pool.fair:
                args.append(max(0, seen - self.charged))
            self._renewing = True
            try:
                state = await pool.coordinator.call(pool.script["renew"], pool.keys, args)
            except CoordinationError:
                # Redis is away; the engine still runs this. Try again soon, so that the
                # lease is back in Redis shortly after Redis is.
                period = min(every, pool.recheck_s)
                continue
            finally:
                self._renewing = False
            self.charged = max(self.charged, seen)  # charged by that renewal
            if self.released:
                return
            period = every
            if state == 0:
                log.warning("lease %s on %s was lost (expired and its slot taken)",
                            self.id, pool.name)
                self._lost.set_result(None)
                return


class RedisTicket:
    """A place in the shared line; granted by the pool's POLL calls."""

    def __init__(self, pool: SharedPool, ticket_id: str, position: int,
                 max_tokens: int | None = None) -> None:
        self._pool = pool
        self.id = ticket_id
        self.position = position
        self.max_tokens = max_tokens  # its request's cap, for the places behind it
        self.enqueued_at = pool.clock()
        self.left = False
        self.future: asyncio.Future[RedisLease] = asyncio.get_running_loop().create_future()

    async def wait(self, timeout_s: float) -> RedisLease:
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(self.future)
        except TimeoutError:
            granted = _granted(self.future)
            if granted is not None:
                return granted  # granted at the very instant the deadline passed
            await self.withdraw()
            raise QueueTimeout from None
        except asyncio.CancelledError:
            self._pool.coordinator.in_background(self.withdraw)  # the client is gone
            raise

    async def withdraw(self) -> None:
        """Leave the line; a slot granted meanwhile (known or not yet) goes back."""
        if self.left:
            return
        self.left = True
        self.position = 0
        self._pool.forget(self)
        granted = _granted(self.future)
        if granted is not None:
            await granted.release()
            return
        if not self.future.done():
            self.future.cancel()
        await self._pool.withdraw_id(self.id)

    def eta_s(self) -> float:
        return self._pool.forecast(self.position) if self.position > 0 else 0.0


def _granted(future: asyncio.Future[RedisLease]) -> RedisLease | None:
    if future.done() and not future.cancelled() and future.exception() is None:
        return future.result()
    return None
