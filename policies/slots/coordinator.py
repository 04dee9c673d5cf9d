"""RedisCoordinator: one per process, the Redis client, the scripts, the breaker and the
one wake-up subscription every shared pool of the process listens on.

Every call has a short timeout and goes through the circuit breaker; failures surface as
`CoordinationError`. It knows pools only as `Subscriber`s (no import of the pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from policies.health.breaker import BreakerState, CircuitBreaker
from policies.slots.base import CircuitOpen, CoordinationBusy, CoordinationError
from policies.slots.lua import ACQUIRE, ENQUEUE, POLL, RELEASE, RENEW, WITHDRAW
from policies.slots.lua_fair import (
    FAIR_ACQUIRE,
    FAIR_ENQUEUE,
    FAIR_POLL,
    FAIR_RELEASE,
    FAIR_RENEW,
    FAIR_WITHDRAW,
)
from policies.slots.stall import StallClock

log = logging.getLogger("slotgate.redis")
RETRIES = 5  # background retries of a release or withdrawal by id
SPARE = 8  # connections beyond the calls': the wake-up subscription, renewals, the prober


class Subscriber(Protocol):
    """A shared pool as the wake-up listener sees it."""

    def wake(self) -> None: ...  # re-check the line: messages may have been lost

    def heard(self, message: bytes) -> None: ...  # a wake-up on the pool's channel


class RedisCoordinator:
    """One per process: the client, the scripts, the breaker and the wake-up subscription."""

    def __init__(self, url: str, prefix: str, call_timeout_s: float, breaker: CircuitBreaker,
                 outage: str = "", max_connections: int = 256,
                 connection_wait_s: float = 5.0, stalls: StallClock | None = None) -> None:
        self.prefix = prefix
        self.call_timeout_s = call_timeout_s
        self.breaker = breaker
        self.where = url.split("@")[-1]  # never the password
        self.outage = outage  # what the gateway does meanwhile, for the log
        self.healthy = asyncio.Event()  # set while the breaker is closed
        self.healthy.set()
        breaker.on_change = self._breaker_changed
        self._prober: asyncio.Task[None] | None = None
        # A call waits for one of `max_connections` (its own bound, its own outcome:
        # `CoordinationBusy`, which the breaker does not count); only then does its
        # `call_timeout_s` run. The blocking pool is the backstop for the other users.
        self.connection_wait_s = connection_wait_s
        self.cap_s = max(4 * call_timeout_s, call_timeout_s + 2.0)  # a call, stalls and all
        self._calls = asyncio.Semaphore(max_connections)
        # A call's timeout does not count the loop's stalls (the process's clock, lent).
        self.stalls = stalls if stalls is not None else StallClock()
        self._own_stalls = stalls is None
        self.waiting = 0  # calls waiting for a free connection now
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections + SPARE, timeout=connection_wait_s,
            socket_timeout=self.cap_s, socket_connect_timeout=self.cap_s,  # backstops
            retry_on_timeout=False, decode_responses=False)
        self.client = aioredis.Redis.from_pool(pool)
        self.scripts = {name: self.client.register_script(text) for name, text in (
            ("acquire", ACQUIRE), ("enqueue", ENQUEUE), ("poll", POLL), ("renew", RENEW),
            ("release", RELEASE), ("withdraw", WITHDRAW), ("fair_acquire", FAIR_ACQUIRE),
            ("fair_enqueue", FAIR_ENQUEUE), ("fair_poll", FAIR_POLL), ("fair_renew", FAIR_RENEW),
            ("fair_release", FAIR_RELEASE), ("fair_withdraw", FAIR_WITHDRAW))}
        self.pools: dict[bytes, Subscriber] = {}  # by wake-up channel
        self._listener: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()

    async def call(self, script: str, keys: Sequence[str], args: Sequence[str | int | float]
                   ) -> Any:
        if not self.breaker.allow():
            raise CircuitOpen("Redis circuit open")
        if self._calls.locked():  # a burst: wait for a connection, not counted as failure
            await self._connection()
        else:
            await self._calls.acquire()
        task = asyncio.current_task()
        cancels = task.cancelling() if task is not None else 0
        try:
            async with self.stalls.deadline(self.call_timeout_s, self.cap_s):
                result = await self.scripts[script](keys=keys, args=args)
        except (RedisError, OSError, TimeoutError) as exc:
            self.breaker.failure()
            log.debug("redis %s failed: %s: %s", script, type(exc).__name__, exc)
            raise CoordinationError(f"{type(exc).__name__}: {exc}") from None
        finally:
            self._calls.release()
        self.breaker.success()
        if task is not None and task.cancelling() > cancels:
            # redis-py (8.x) may finish a command its caller was cancelled in and return
            # its reply: the cancellation is still pending, and the caller must see it.
            raise asyncio.CancelledError
        return result

    async def _connection(self) -> None:
        self.waiting += 1
        try:
            async with asyncio.timeout(self.connection_wait_s):
                await self._calls.acquire()
        except TimeoutError:
            log.warning("no Redis connection came free within %g s (%d calls waiting)",
                        self.connection_wait_s, self.waiting)
            raise CoordinationBusy("no free Redis connection in time") from None
        finally:
            self.waiting -= 1

    def _breaker_changed(self, state: BreakerState) -> None:
        if state is BreakerState.OPEN and self.healthy.is_set():
            self.healthy.clear()
            log.warning("Redis at %s is unreachable: %s until it answers", self.where,
                        self.outage or "shared pools are unavailable")
            if self._prober is None or self._prober.done():
                self._prober = asyncio.create_task(self._probe_until_closed())
        elif state is BreakerState.CLOSED and not self.healthy.is_set():
            self.healthy.set()
            log.warning("Redis at %s answers again: pools are shared again", self.where)

    async def _probe_until_closed(self) -> None:
        """Recovery needs no traffic: while the breaker is open, ping at each probe time."""
        while self.breaker.state is not BreakerState.CLOSED:
            await asyncio.sleep(max(self.breaker.retry_in_s(), 0.01))  # the probe schedule
            if not self.breaker.allow():
                continue
            try:
                async with asyncio.timeout(self.call_timeout_s):
                    await self.client.ping()
            except (RedisError, OSError, TimeoutError):
                self.breaker.failure()
            else:
                self.breaker.success()

    def in_background(self, work: Callable[[], Any]) -> None:
        task = asyncio.ensure_future(work())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def start(self) -> None:
        if self._own_stalls:
            self.stalls.start()
        self._listener = asyncio.create_task(self._listen(), name="redis-wake-ups")

    async def _listen(self) -> None:
        """Wake a pool's local waiters when any replica releases or leaves; reconnect on loss.

        Nothing stops this loop but cancellation: while it is down, pools re-check on
        their own every `recheck_s`.
        """
        backoff = 0.1
        while True:
            pubsub = self.client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(*self.pools)
                backoff = 0.1
                for pool in self.pools.values():
                    pool.wake()  # messages may have been lost while unsubscribed
                while True:
                    message = await pubsub.get_message(timeout=None)
                    heard = self.pools.get(message["channel"]) if message else None
                    if heard is not None:
                        heard.heard(message["data"])
            except (RedisError, OSError) as exc:
                log.debug("redis wake-up subscription lost (%s); resubscribing", exc)
            except Exception:  # a bug here must not end wake-ups for good: log it, go on
                log.exception("redis wake-up listener failed; resubscribing")
            finally:
                with contextlib.suppress(RedisError, OSError, RuntimeError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]
            await asyncio.sleep(backoff)  # a reconnect backoff
            backoff = min(2.0, backoff * 2)

    async def close(self) -> None:
        if self._own_stalls:
            self.stalls.stop()
        tasks = {task for task in (self._listener, self._prober) if task is not None}
        for task in tasks:
            task.cancel()
        if tasks:  # asyncio.wait: their cancellation ends here, a cancel of close() does not
            await asyncio.wait(tasks)
        if self._background:
            await asyncio.wait(self._background, timeout=self.call_timeout_s * RETRIES)
        await self.client.aclose()
