"""Admission: run now, wait in a queue, or reject. Pure: snapshots in, a decision out.

Order: a free slot on the primary; room in the primary's queue; then, when the route
allows overflow, a fallback with a free slot, then a fallback with queue room
(each in the route's order, among those `able` to serve the request); otherwise reject
with a Retry-After. Room in a queue counts the `sheddable` waiters a newcomer of a higher
class would displace.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass

from policies.config import Overflow, Priority
from policies.slots import PoolSnapshot


class RouteReason(enum.StrEnum):
    PRIMARY = "primary"
    OVERFLOW = "fallback:overflow"


class RejectReason(enum.StrEnum):
    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    SHED = "shed"  # a sheddable waiter gave its place to a higher class
    CONCURRENCY = "concurrency_limit"  # the key's own cap on requests at once
    BUDGET = "budget_exceeded"  # the key's token or cost budget for the period
    RATE_LIMIT = "rate_limit"  # the key's requests (rpm) or tokens (tpm) per minute
    UNAVAILABLE = "coordination_unavailable"  # the shared pool's Redis is away (fail_closed)
    DRAINING = "draining"  # the gateway is shutting down: retry, another replica answers
    BODY_BYTES = "inflight_body_bytes"  # the process holds its bound of request bodies
    OBJECTIVE = "objective_shed"  # sheddable, and no option meets its TTFT objective
    BACKEND_UNAVAILABLE = "backend_unavailable"  # its backend and fallbacks out of service
    SLOT_LOST = "slot_lost"  # a shared slot's lease lapsed in Redis mid-answer
    SHUTDOWN = "shutdown"  # the drain timed out and cut an answer
    SUBSCRIBERS = "too_many_subscribers"  # the dashboards' feed has its bound of watchers
    CONNECTIONS = "too_many_connections"  # the process's, or one address's, bound of sockets
    WARMUP = "warmup_timeout"  # a cold group had no replica ready within its warm-up bound


# Not frozen, though never changed once made: made for every decision that reaches this
# stage, and a frozen dataclass sets each field through object.__setattr__
# (policies/scheduler/decision.py).
@dataclass(slots=True)
class Run:
    pool: str
    reason: RouteReason


@dataclass(slots=True)
class Wait:
    pool: str
    reason: RouteReason


@dataclass(slots=True)
class Reject:
    reason: RejectReason
    retry_in_s: float  # when a retry is worth it: the soonest forecast (the table clamps)


Decision = Run | Wait | Reject


def decide(
    primary: PoolSnapshot,
    fallbacks: Sequence[PoolSnapshot],
    overflow: Overflow,
    priority: Priority = Priority.STANDARD,
    *,
    forecast: Callable[[PoolSnapshot], float],
    able: Container[str] | None = None,
) -> Decision:
    """Where the request goes, or why not. `forecast(pool)`: the pool's own forecast of
    seconds until its next slot frees, asked only for a rejection's Retry-After. `able`:
    the fallbacks that serve the request (None: all), asked only when it would overflow."""
    if primary.open:
        return Run(primary.name, RouteReason.PRIMARY)
    if primary.room_for(priority) > 0:
        return Wait(primary.name, RouteReason.PRIMARY)
    considered = [primary]
    if overflow is Overflow.FALLBACK:
        if able is not None:
            fallbacks = [pool for pool in fallbacks if pool.name in able]
        for pool in fallbacks:
            if pool.open:
                return Run(pool.name, RouteReason.OVERFLOW)
        for pool in fallbacks:
            if pool.room_for(priority) > 0:
                return Wait(pool.name, RouteReason.OVERFLOW)
        considered.extend(fallbacks)
    return Reject(RejectReason.QUEUE_FULL, min(map(forecast, considered)))
