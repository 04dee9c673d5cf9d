"""Which replica of a group takes a request, among those with a free slot.  Pure: no I/O,
no clock.

Inputs are one snapshot of the group's replicas (slots, busy slots, token work in flight,
health, an optional KV-pressure penalty), the request's token estimate, and what is known
of where it belongs: the replica holding its longest known prompt prefix
(`policies.scheduler.prefix.AffinityTable.match`) and a session key.

Bounded loads (consistent hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam):
no mode sends a request to a replica whose load with it would pass (1 + epsilon) x the
group's mean (over healthy replicas, the request included) while a free replica within
that bound exists. The least loaded free replica is always within it: when even it is
not, nothing better is to be had.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from policies.scheduler.prefix import NO_MATCH, Match

EPSILON = 0.25  # a replica may run a quarter more than the mean before affinity yields
_MASK = (1 << 64) - 1


class PickMode(enum.StrEnum):
    AFFINITY = "affinity"  # longest prefix, else the session's replica, else least loaded
    LEAST_LOADED = "least_loaded"
    ROUND_ROBIN = "round_robin"


class PickReason(enum.StrEnum):
    """Why a replica was chosen (a metric label: a closed set)."""

    PREFIX = "prefix"  # it holds the request's longest known prefix
    SESSION = "session"  # the session key's replica (no prefix known, or its replica busy)
    LEAST_LOADED = "least_loaded"
    ROUND_ROBIN = "round_robin"
    BOUND = "bound"  # the replica affinity or the turn named was too hot: least loaded
    HOLD = "hold"  # it waits for the busy replica holding its prefix (sooner than a cold prefill)


@dataclass(frozen=True, slots=True)
class Replica:
    """One replica at the instant of the snapshot. `load_tokens`: prompt plus expected
    output tokens of the requests it runs. `penalty` in [0, 1]: the engine's KV-cache
    pressure, which weighs its load (full pressure counts it twice) and breaks ties."""

    name: str
    slots: int
    active: int
    load_tokens: int
    healthy: bool = True
    penalty: float = 0.0

    @property
    def free(self) -> bool:
        return self.healthy and self.active < self.slots


@dataclass(frozen=True, slots=True)
class Pick:
    """The replica chosen and why; `cursor`: what to pass as the next round-robin cursor
    (the position after the chosen replica in the snapshot)."""

    replica: str
    reason: PickReason
    cursor: int


@dataclass(frozen=True, slots=True)
class Hold:
    """Wait for `replica`, which holds the request's prefix, for at most `patience_s`
    (then take any replica's next slot); its slot is expected in `eta_s`."""

    replica: str
    patience_s: float
    eta_s: float


def hold_out(replicas: Sequence[Replica], tokens: int, prefix: Match, warm_tokens: int,
             saving_s: float, holder_wait_s: Callable[[], float], other_wait_s: float,
             epsilon: float = EPSILON) -> Hold | None:
    """Should a request wait for the busy replica holding its prefix rather than run
    elsewhere? Yes when its expected time to first token there (the wait for a slot on
    it, `holder_wait_s()`, asked only if it may) beats the soonest elsewhere: the next
    slot on another replica (`other_wait_s`: 0 when one is free) and the prefill of the
    blocks that replica lacks (`saving_s`: the warm tokens' prefill time). It waits at
    most that long: past it, a cold start elsewhere is no longer later. A holder that
    is unhealthy, free (the pick takes it), or whose load with the request (less its
    `warm_tokens`, not prefilled there) would pass the bound (`bound`) is not waited
    for."""
    if not prefix.blocks or prefix.replica is None or saving_s <= 0:
        return None
    holder = next((r for r in replicas if r.name == prefix.replica), None)
    if holder is None or not holder.healthy or holder.free:
        return None
    if holder.load_tokens + tokens - min(warm_tokens, tokens) > bound(replicas, tokens, epsilon):
        return None
    patience_s = other_wait_s + saving_s
    wait_s = holder_wait_s()
    if not wait_s < patience_s:
        return None
    return Hold(holder.name, patience_s, wait_s)


def session_key(header: str | None, user: object) -> str | None:
    """The key that keeps a conversation on one replica: the `x-session-id` header, else
    the body's `user` field (a string, not empty)."""
    if header:
        return header
    return user if isinstance(user, str) and user else None


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest())


_name_digest = functools.lru_cache(maxsize=1024)(_digest)  # replica names recur every pick


def _weight(seed: int, name: str) -> int:
    """A name's weight for a session: splitmix64's finalizer over the two digests."""
    value = seed ^ _name_digest(name)
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK
    return value ^ (value >> 31)


def rendezvous(key: str, names: Sequence[str]) -> str:
    """Highest-random-weight hashing: the name `key` ranks first among `names` (not empty).
    A name leaving the set moves only the keys it held; a new one takes only its share.
    Stable across processes: every gateway worker sends a session to the same replica."""
    return max(names, key=functools.partial(_weight, _digest(key)))


def bound(replicas: Sequence[Replica], tokens: int, epsilon: float) -> float:
    """The most load (the request's `tokens` included) a replica may carry:
    (1 + epsilon) x the mean over the healthy replicas, the request counted in."""
    healthy = [r.load_tokens for r in replicas if r.healthy]
    return (1 + epsilon) * (sum(healthy) + tokens) / max(len(healthy), 1)


def _lightest(free: Sequence[Replica], tokens: int, cap: float) -> Replica:
    """The replica of `free` within `cap` with the least load weighed by its KV pressure;
    then the least pressure, the lowest name. The least loaded free replica is always
    within `cap`: never empty."""
    return min((r for r in free if r.load_tokens + tokens <= cap),
               key=lambda r: ((r.load_tokens + tokens) * (1 + r.penalty), r.penalty, r.name))


def pick(replicas: Sequence[Replica], tokens: int, *, mode: PickMode = PickMode.AFFINITY,
         prefix: Match = NO_MATCH, session: str | None = None, epsilon: float = EPSILON,
         cursor: int = 0, warm_tokens: int = 0) -> Pick | None:
    """The replica to run a request of `tokens` (prompt plus expected output) on, among
    `replicas` that are healthy with a free slot; None when there is none (it waits).

    `prefix`: the table's longest match for the request's prompt, `warm_tokens` the prompt
    tokens that match covers: on the replica holding them they are not prefilled again, so
    the request adds only the rest to its load there. `session`: its session key.
    `cursor`: round robin's position (the previous pick's `cursor`, or any counter). A
    replica affinity or the turn would choose gives way to the least loaded one within the
    bound (reason BOUND) when it is over the bound and another is not.
    """
    free = [r for r in replicas if r.healthy and r.active < r.slots]
    if not free:
        return None
    # Never below the least loaded free replica: when all are over the bound, the
    # preferred one may stay if no other is lighter.
    cap = max(bound(replicas, tokens, epsilon), min(r.load_tokens for r in free) + tokens)
    preferred, reason = _preferred(replicas, free, mode, prefix, session, cursor)
    adds = tokens - min(warm_tokens, tokens) if reason is PickReason.PREFIX else tokens
    if preferred is None:
        chosen = _lightest(free, tokens, cap)
    elif preferred.load_tokens + adds <= cap:
        chosen = preferred
    else:
        chosen, reason = _lightest(free, tokens, cap), PickReason.BOUND
    position = next(i for i, replica in enumerate(replicas) if replica is chosen)
    return Pick(chosen.name, reason, position + 1)


def _preferred(replicas: Sequence[Replica], free: Sequence[Replica], mode: PickMode,
               prefix: Match, session: str | None,
               cursor: int) -> tuple[Replica | None, PickReason]:
    """The replica the mode names before load is weighed, and why (None: no preference)."""
    if mode is PickMode.ROUND_ROBIN:
        start = cursor % len(replicas)
        turn = next(r for r in (*replicas[start:], *replicas[:start]) if r.free)
        return turn, PickReason.ROUND_ROBIN
    if mode is PickMode.LEAST_LOADED:
        return None, PickReason.LEAST_LOADED
    if prefix.blocks and prefix.replica is not None:
        held = next((r for r in free if r.name == prefix.replica), None)
        if held is not None:
            return held, PickReason.PREFIX
    if session is not None:
        name = rendezvous(session, [r.name for r in free])
        return next(r for r in free if r.name == name), PickReason.SESSION
    return None, PickReason.LEAST_LOADED
