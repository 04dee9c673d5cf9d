"""The `SlotPool` seam: bounded concurrency per backend, with its mechanisms side by side.

    base         the roles (`SlotPool`, `Lease`, `Ticket`), `PoolSnapshot` and the errors
    local        `LocalSlotPool`: one process, one event loop (`local_tickets`: its leases
                 and tickets, `local_pins`: its waiters pinned to a replica, `line`: a
                 class's FIFO line, `fair`: a class's line shared fairly between tenants)
    redis        `RedisSlotPool`: shared by every process through Redis (`lua`: its scripts,
                 `coordinator`: the one client and wake-up subscription per process,
                 `seating`: its group of engine replicas as this process sees it,
                 `shared`: the leases and tickets it hands out)
    failover     what a shared pool does while Redis is away
    handover     move offers: waiters of one pool that would take a slot on another

The package re-exports the role and the local pool; the Redis parts are imported from
their modules, so that a gateway without Redis never loads its client.
"""

from policies.slots.base import (
    FORECAST_TTL_S,
    SHEDDABLE,
    Clock,
    CoordinationError,
    Lease,
    PoolSnapshot,
    PoolUnavailable,
    QueueShed,
    QueueTimeout,
    Seats,
    Share,
    SlotPool,
    Ticket,
)
from policies.slots.local import LocalLease, LocalSlotPool, LocalTicket

__all__ = [
    "FORECAST_TTL_S",
    "SHEDDABLE",
    "Clock",
    "CoordinationError",
    "Lease",
    "LocalLease",
    "LocalSlotPool",
    "LocalTicket",
    "PoolSnapshot",
    "PoolUnavailable",
    "QueueShed",
    "QueueTimeout",
    "Seats",
    "Share",
    "SlotPool",
    "Ticket",
]
