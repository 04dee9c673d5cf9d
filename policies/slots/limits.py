"""SharedQuotas: the per-key limits held in Redis for every process and replica
(`coordination.mode: redis`), the model of `policies.limits.model` run by the scripts of
`policies.slots.limits_lua`.

A request reserves its estimate at admission (one RESERVE call) and settles what it used
when it ends (one SETTLE call, in the background: the answer does not wait for it). A
reservation has an expiry, renewed for all of this process's live reservations by one
heartbeat every TTL/3 (one pipelined RENEW per key that has any): a process that dies
gives its reservations back within the TTL. A settle whose call fails is not retried (a
timed-out call may have been applied: a retry would charge twice), and what it used stays
uncharged in Redis; but its hold, like the hold of a RESERVE whose outcome is unknown (its
call failed or timed out), is queued and given back by one idempotent RELEASE per key as
soon as Redis answers again, so a blip locks no key out for longer than the blip.

While Redis is away (a failed call, or the breaker open): `fail_closed` refuses
(`coordination_unavailable`, 503 + Retry-After); `fail_open_local` admits by this
process's own book (`policies.limits.quotas.Quotas`, each key's concurrency, rpm and tpm cut to
1/expected_replicas, budgets whole against the spend this process knows: the ledger's at
its start plus what it settled since).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Iterable, Mapping

from redis.exceptions import RedisError

from policies.config import ApiKeyConfig
from policies.limits.model import Budget, Limit, Limits
from policies.limits.model import Refusal as ModelRefusal
from policies.limits.quotas import QuotaHold, Quotas, Refusal, refusal
from policies.scheduler.admission import RejectReason
from policies.slots.base import CircuitOpen, CoordinationBusy, CoordinationError
from policies.slots.coordinator import RedisCoordinator
from policies.slots.limits_lua import (
    KEY_NAMES,
    REFUSALS,
    RELEASE,
    RENEW,
    RESERVE,
    SEED,
    SETTLE,
)

log = logging.getLogger("slotgate.redis")
_SCRIPTS = {"limits_reserve": RESERVE, "limits_renew": RENEW, "limits_settle": SETTLE,
            "limits_seed": SEED, "limits_release": RELEASE}
MAX_UNKNOWN = 10_000  # holds queued for release; beyond, they expire within the TTL
RELEASE_BATCH = 500  # hold ids per RELEASE call
_LIMITS = {name: Limit(name) for name in REFUSALS}


def limit_args(limits: Limits) -> list[str | int]:
    """The limits as the scripts' ARGV tail."""
    args: list[str | int] = [limits.max_concurrent or 0, limits.rpm or 0, limits.tpm or 0,
                             len(limits.budgets)]
    for budget in limits.budgets:
        args += [budget.period, budget.tokens or 0, repr(budget.cost or 0.0)]
    return args


def refused(reply: list[int], limits: Limits) -> ModelRefusal | None:
    """RESERVE's reply as the model's refusal (None: admitted)."""
    code, retry_ms, index = int(reply[0]), int(reply[1]), int(reply[2])
    if code == 0:
        return None
    budget: Budget | None = limits.budgets[index - 1] if index else None
    return ModelRefusal(_LIMITS[REFUSALS[code - 1]], retry_ms, budget)


class SharedQuotas:
    """Every limited key's limits in Redis, with `fallback` while Redis is away (None:
    fail closed)."""

    def __init__(self, coordinator: RedisCoordinator, keys: Iterable[ApiKeyConfig],
                 lease_ttl_s: float, fallback: Quotas | None) -> None:
        self.coordinator = coordinator
        self.fallback = fallback
        self.ttl_ms = int(lease_ttl_s * 1000)
        self.limits: dict[str, Limits] = {}
        self.mine: dict[str, dict[str, QuotaHold]] = {}  # key id -> this process's holds
        self._prefix = f"{coordinator.prefix}:limits"
        self._ids = itertools.count()
        self._process = os.urandom(6).hex()  # hold ids unique across processes
        for name, text in _SCRIPTS.items():  # the coordinator calls them by name
            coordinator.scripts[name] = coordinator.client.register_script(text)
        self._heartbeat: asyncio.Task[None] | None = None
        self.unknown: dict[str, set[str]] = {}  # key id -> holds to give back
        self._releaser: asyncio.Task[None] | None = None
        self.configure(keys)

    def keys(self, key_id: str) -> list[str]:
        tag = f"{{{self._prefix}:{key_id}}}"  # one hash slot for all of the key's keys
        return [f"{tag}:{name}" for name in KEY_NAMES]

    def configure(self, keys: Iterable[ApiKeyConfig]) -> None:
        """New limits (the fallback book is the gateway's own: configured with it)."""
        self.limits = {key.id: limits for key in keys
                       if (limits := Limits.of(key)) is not None}

    async def seed(self, period: str, spent: Mapping[str, tuple[int, float]]) -> None:
        """Start each key's spend in the current `period` at the ledger's, where Redis
        has none for it yet (the first process to start seeds; Redis keeps it after)."""
        for key_id, (tokens, cost) in spent.items():
            limits = self.limits.get(key_id)
            if limits is None or all(b.period != period for b in limits.budgets):
                continue
            try:
                await self.coordinator.call("limits_seed", self.keys(key_id),
                                            [period, tokens, repr(cost)])
            except CoordinationError as exc:
                log.warning("could not seed key %s's %sly spend in Redis: %s", key_id,
                            period, exc)

    async def reserve(self, key_id: str, tokens: int, cost: float
                      ) -> QuotaHold | Refusal | None:
        """Reserve a request's estimate in Redis, or say which limit refuses it (None:
        the key has no limits)."""
        limits = self.limits.get(key_id)
        if limits is None:
            return None
        hold_id = f"{self._process}-{next(self._ids)}"
        try:
            reply = await self.coordinator.call(
                "limits_reserve", self.keys(key_id),
                [hold_id, self.ttl_ms, tokens, repr(cost), *limit_args(limits)])
        except CoordinationError as exc:
            if not isinstance(exc, (CircuitOpen, CoordinationBusy)):  # it may have run
                self.give_back(key_id, hold_id)
            if self.fallback is None:
                return Refusal(RejectReason.UNAVAILABLE, self.coordinator.breaker.retry_in_s(),
                               "This key's limits are shared through Redis, which cannot "
                               "be reached; retry later.")
            return self.fallback.reserve(key_id, tokens, cost, hold_id)
        no = refused(reply, limits)
        if no is not None:
            return refusal(no, limits)
        hold = QuotaHold(key_id, hold_id, tokens, cost, shared=True)
        self.mine.setdefault(key_id, {})[hold_id] = hold
        return hold

    def settle(self, hold: QuotaHold, tokens: int, cost: float) -> None:
        """The request of `hold` ended having used `tokens` and `cost`."""
        if self.fallback is not None:
            if not hold.shared:
                self.fallback.settle(hold, tokens, cost)
                return
            self.fallback.charge(hold.key_id, tokens, cost)  # its spend, known here too
        held = self.mine.get(hold.key_id)
        if held is not None:
            held.pop(hold.id, None)
            if not held:
                del self.mine[hold.key_id]
        if hold.shared:
            self.coordinator.in_background(lambda: self._settle(hold, tokens, cost))

    async def _settle(self, hold: QuotaHold, tokens: int, cost: float) -> None:
        limits = self.limits.get(hold.key_id, Limits())
        try:
            await self.coordinator.call(
                "limits_settle", self.keys(hold.key_id),
                [hold.id, hold.tokens, tokens, repr(cost), *limit_args(limits)])
        except CoordinationError as exc:
            log.warning("could not settle a request of key %s in Redis (%s): its "
                        "reservation is given back once Redis answers", hold.key_id, exc)
            self.give_back(hold.key_id, hold.id)

    def give_back(self, key_id: str, hold_id: str) -> None:
        """Queue a hold whose state in Redis is unknown for release when Redis answers."""
        if sum(map(len, self.unknown.values())) >= MAX_UNKNOWN:
            log.warning("too many reservations to give back; key %s's expires within the "
                        "lease TTL", key_id)
            return
        self.unknown.setdefault(key_id, set()).add(hold_id)
        if self._releaser is None or self._releaser.done():
            self._releaser = asyncio.create_task(self._release_unknown(),
                                                 name="limits-give-back")

    async def _release_unknown(self) -> None:
        """Give the queued holds back, one RELEASE per key, as soon as Redis answers."""
        backoff = 0.05
        while self.unknown:
            key_id, ids = next(iter(self.unknown.items()))
            batch = list(itertools.islice(ids, RELEASE_BATCH))
            try:
                await self.coordinator.call("limits_release", self.keys(key_id),
                                            [self.ttl_ms, *batch])
            except CoordinationError:
                if not self.coordinator.healthy.is_set():
                    await self.coordinator.healthy.wait()  # the breaker's prober: Redis is back
                else:
                    await asyncio.sleep(backoff)  # a failed call, breaker still closed
                    backoff = min(1.0, backoff * 2)
                continue
            backoff = 0.05
            ids.difference_update(batch)
            if not ids:
                self.unknown.pop(key_id, None)

    def start(self) -> None:
        self._heartbeat = asyncio.create_task(self._beat(), name="limits-heartbeat")

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_ms / 3000)  # the renewal schedule
            if self.mine:
                await self.renew()

    async def renew(self) -> None:
        """Extend every live reservation of this process: one pipelined call, one RENEW
        per key holding any."""
        coordinator = self.coordinator
        if not coordinator.breaker.allow():
            return
        held = [(key_id, list(holds)) for key_id, holds in self.mine.items()]
        script = coordinator.scripts["limits_renew"]
        try:
            async with asyncio.timeout(coordinator.call_timeout_s):
                async with coordinator.client.pipeline(transaction=False) as pipe:
                    for key_id, ids in held:
                        await script(keys=self.keys(key_id), args=[self.ttl_ms, *ids],
                                     client=pipe)
                    replies = await pipe.execute()
        except (RedisError, OSError, TimeoutError) as exc:
            coordinator.breaker.failure()
            log.debug("redis limits renewal failed: %s: %s", type(exc).__name__, exc)
            return
        coordinator.breaker.success()
        for (key_id, _), lost in zip(held, replies, strict=True):
            holds = self.mine.get(key_id, {})
            for hold_id in lost:
                holds.pop(hold_id.decode(), None)  # expired meanwhile: nothing to renew

    async def close(self) -> None:
        for task in (self._heartbeat, self._releaser):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
