"""The desired replica counts of gateways sharing Redis (#34, `coordination.mode: redis`):
each gateway sees only its own share of the arrivals, so at each look it writes its own
figures of a backend (the rate of slots it let go and its clock's mean hold) into a Redis
hash, stamped with Redis's time, and computes from all the gateways' figures there. A
gateway that stopped writing (it died) drops out once its figures are `TTL_LOOKS` looks
old. The line is not summed: a shared pool's `queued` already is the one line of all.

One call per scaled backend per look, in the background task of `FleetSignals`: nothing on
the request path.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from policies.fleet.desired import Demand

if TYPE_CHECKING:
    from policies.slots.coordinator import RedisCoordinator

TTL_LOOKS = 3  # a gateway's figures count for this many looks after it wrote them
MIN_TTL_S = 1.0  # and at least this long (a loop a little late is no dead gateway)

# KEYS[1]: hash gateway -> 'rate hold at_ms'. ARGV: this gateway, its rate, its mean hold,
# the figures' time to live (ms). Writes this gateway's, drops those older than the TTL,
# returns the values of every gateway left (this one's included).
DEMAND = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[4])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. now)
local out = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local at = tonumber(string.match(all[i + 1], '(%d+)$') or '0')
  if now - at > ttl then
    redis.call('HDEL', KEYS[1], all[i])
  else
    table.insert(out, all[i + 1])
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
return out
"""


def key(prefix: str, backend: str, what: str) -> str:
    """A key beside the backend's shared pool's (the same hash tag: one Cluster slot)."""
    return f"{{{prefix}:{backend}}}:{what}"


def gateway_id() -> str:
    """This gateway's name in the shared figures: host, process and a random part (two
    gateways in one process are two)."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


@dataclass(frozen=True, slots=True)
class Share:
    """One gateway's figures of one backend, as it last wrote them."""

    rate: float
    mean_hold_s: float


class SharedDemand:
    """Writes this gateway's figures and reads every gateway's (raises CoordinationError
    when Redis does not answer: the caller falls back to its own)."""

    def __init__(self, coordinator: RedisCoordinator) -> None:
        self.coordinator = coordinator
        self.id = gateway_id()
        coordinator.scripts["fleet_demand"] = coordinator.client.register_script(DEMAND)

    async def exchange(self, backend: str, own: Demand, refresh_s: float) -> list[Share]:
        ttl_ms = int(max(MIN_TTL_S, TTL_LOOKS * refresh_s) * 1000)
        reply = await self.coordinator.call(
            "fleet_demand", [key(self.coordinator.prefix, backend, "demand")],
            [self.id, repr(own.rate), repr(own.mean_hold_s), ttl_ms])
        return [_share(value) for value in reply]


def summed(own: Demand, shares: Sequence[Share]) -> Demand:
    """The fleet's demand: the rates summed; the mean hold weighted by each gateway's rate
    (by gateway when none has any); the line and the objective as this gateway sees them
    (the line is shared already)."""
    if not shares:
        return own
    rate = sum(s.rate for s in shares)
    weights = [s.rate for s in shares] if rate > 0 else [1.0] * len(shares)
    hold = sum(w * s.mean_hold_s for w, s in zip(weights, shares, strict=True)) / sum(weights)
    return Demand(rate, hold, own.queued, own.objective_s)


def _share(value: bytes) -> Share:
    rate, hold, _ = value.decode().split(" ")
    return Share(max(0.0, float(rate)), max(0.0, float(hold)))
