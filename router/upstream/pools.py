"""Building each backend's slot pool: local, or shared through Redis with its failover.

The Redis client is imported only in `mode: redis` (it is the `redis` extra).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from policies.clock.answers import hints
from policies.clock.clock import Clock
from policies.config import (
    BackendConfig,
    CoordinationConfig,
    CoordinationMode,
    QueueOrder,
    RedisDown,
)
from policies.health.breaker import CircuitBreaker
from policies.slots import LocalSlotPool, SlotPool
from router.common.config_error import from_env

if TYPE_CHECKING:
    from policies.slots.coordinator import RedisCoordinator
    from policies.slots.stall import StallClock

log = logging.getLogger("slotgate")


async def start_coordinator(config: CoordinationConfig, stalls: StallClock
                            ) -> RedisCoordinator:
    """The process's Redis coordinator, its breaker logging every change of state.

    Redis being down at startup does not stop the gateway: it serves by `on_redis_down`
    and says so, and recovers by itself when Redis answers.
    """
    try:
        from policies.slots.coordinator import RedisCoordinator
    except ImportError:
        raise RuntimeError("coordination.mode: redis needs the Redis client: "
                           "pip install 'slotgate[redis]'") from None
    url = from_env(config.url, config.url_env, "coordination.url_env")
    assert url is not None
    breaker = CircuitBreaker(config.breaker_failures, config.breaker_open_s, time.monotonic)
    outage = ("answering 503 + Retry-After" if config.on_redis_down is RedisDown.FAIL_CLOSED
              else f"each process using a local share of the slots "
                   f"(slots / {config.expected_replicas})")
    coordinator = RedisCoordinator(url, config.key_prefix, config.call_timeout_s,
                                   breaker, outage, config.max_connections,
                                   config.connection_wait_s, stalls)
    from redis.exceptions import RedisError

    try:
        await coordinator.client.ping()
        log.info("slot pools shared through Redis at %s (prefix %s)", coordinator.where,
                 config.key_prefix)
    except (RedisError, OSError) as exc:  # say it, and serve per the setting
        log.warning("Redis at %s is unreachable at startup (%s): %s until it answers",
                    coordinator.where, type(exc).__name__, outage)
        for _ in range(config.breaker_failures):
            breaker.failure()  # open: the prober takes it from here
    return coordinator


def tune(pool: SlotPool, backend: BackendConfig) -> None:
    """A local pool's order within a class (at build and at each reload: `order_by`) and
    a local group's look-ahead for its waiters (a fifo line's only: a fair line serves by
    tenant, not by replica)."""
    if isinstance(pool, LocalSlotPool):
        pool.order_by(backend.queue_order)
        grouped = backend.endpoints is not None and len(backend.endpoints) > 1
        fifo = backend.queue_order is QueueOrder.FIFO
        pool.look_ahead = backend.affinity.look_ahead if grouped and fifo else 0
        pool.max_bypass = backend.affinity.max_bypass


def make_pool(name: str, backend: BackendConfig, config: CoordinationConfig,
              coordinator: RedisCoordinator | None,
              clock: Clock | None = None) -> SlotPool:
    """`clock`: the backend's clock, whose holds and answers its pools' forecasts read (a
    new one from the config's hints by default)."""
    clock = clock or Clock(backend.initial_hold_s, hints(backend))
    estimator, answers = clock.holds, clock.answers
    replicas = {e.name or name: e.slots for e in backend.replicas(name)}
    if config.mode is CoordinationMode.LOCAL or coordinator is None:
        pool = LocalSlotPool(name, backend.slots, backend.queue_limit, estimator,
                             replicas=replicas, answers=answers)
        tune(pool, backend)
        return pool
    from policies.slots.failover import FailoverPool, local_share, local_shares
    from policies.slots.redis import RedisSlotPool

    shared = RedisSlotPool(name, backend.slots, backend.queue_limit, estimator, coordinator,
                           config.lease_ttl_s, config.recheck_s, replicas=replicas,
                           answers=answers, queue_order=backend.queue_order)
    local = None
    if config.on_redis_down is RedisDown.FAIL_OPEN_LOCAL:
        local = LocalSlotPool(name, local_share(backend.slots, config.expected_replicas),
                              backend.queue_limit, estimator,
                              replicas=local_shares(replicas, config.expected_replicas),
                              answers=answers)
        local.order_by(backend.queue_order)  # the shared line's order, while Redis is away
    return FailoverPool(shared, local, config.expected_replicas)
