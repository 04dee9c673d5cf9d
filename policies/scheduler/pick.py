"""Which replica of a group takes a request, among those with a free slot.  Pure: no I/O,
no clock.

Inputs are one snapshot of the group's replicas (slots, busy slots, token work in flight,
health, an optional KV-pressure penalty), the request's token estimate, and what is known
of where it belongs: the replica holding its longest known prompt prefix
(`policies.scheduler.prefix.AffinityTable.match`) and a session key.

Modes: `affinity` (the prefix a replica holds, else the session's replica, else least
loaded), `least_loaded`, `round_robin`, `power_of_two` (the lighter of two free replicas
drawn at random: the cursor and the group's load seed the draw, so the pick stays pure).

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
import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from policies.scheduler.prefix import NO_MATCH, Match

EPSILON = 1.0  # a replica may run twice the mean (less what it holds) before affinity yields
_MASK = (1 << 64) - 1


class PickMode(enum.StrEnum):
    AFFINITY = "affinity"  # longest prefix, else the session's replica, else least loaded
    LEAST_LOADED = "least_loaded"
    ROUND_ROBIN = "round_robin"
    POWER_OF_TWO = "power_of_two"  # the lighter of two replicas drawn from the free ones


class PickReason(enum.StrEnum):
    """Why a replica was chosen (a metric label: a closed set)."""

    PREFIX = "prefix"  # it holds the request's longest known prefix
    SESSION = "session"  # the session key's replica (no prefix known, or its replica busy)
    LEAST_LOADED = "least_loaded"
    ROUND_ROBIN = "round_robin"
    POWER_OF_TWO = "power_of_two"
    BOUND = "bound"  # the replica affinity or the turn named was too hot: least loaded
    HOLD = "hold"  # it waits for the busy replica holding its prefix (sooner than a cold prefill)


# Not frozen, though never changed once made: made for every decision that reaches this
# stage, and a frozen dataclass sets each field through object.__setattr__
# (policies/scheduler/decision.py).
@dataclass(slots=True)
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


@dataclass(slots=True)
class Pick:
    """The replica chosen and why; `cursor`: what to pass as the next round-robin cursor
    (the position after the chosen replica in the snapshot)."""

    replica: str
    reason: PickReason
    cursor: int


@dataclass(slots=True)
class Hold:
    """Wait for `replica`, which holds the request's prefix, for at most `patience_s`
    (then take any replica's next slot); its slot is expected in `eta_s`."""

    replica: str
    patience_s: float
    eta_s: float


def hold_out(replicas: Sequence[Replica], tokens: int, prefix: Match, warm_tokens: int,
             saving_s: float, holder_wait_s: Callable[[], float], other_wait_s: float,
             epsilon: float = EPSILON, crowd: float = 0.0) -> Hold | None:
    """Should a request wait for the busy replica holding its prefix rather than run
    elsewhere? Yes when its expected time to first token there (the wait for a slot on
    it, `holder_wait_s()`, asked only if it may) beats the soonest elsewhere: the next
    slot on another replica (`other_wait_s`: 0 when one is free) and the prefill of the
    blocks that replica lacks (`saving_s`: the warm tokens' prefill time). It waits at
    most that long: past it, a cold start elsewhere is no longer later. A holder that
    is unhealthy, free (the pick takes it), or whose load with the request (less its
    `warm_tokens`, not prefilled there) would pass the bound (`bound`) is not waited
    for. `crowd`: the waiters per slot when none is free: a cold prefill then also holds
    a slot they need, delaying each by its share, so what it costs counts that many
    times more."""
    if not prefix.blocks or prefix.replica is None or saving_s <= 0:
        return None
    holder = next((r for r in replicas if r.name == prefix.replica), None)
    if holder is None or not holder.healthy or holder.free:
        return None
    if holder.load_tokens + tokens - min(warm_tokens, tokens) > bound(replicas, tokens, epsilon):
        return None
    patience_s = other_wait_s + saving_s * (1 + crowd)
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


def _lightest(free: Sequence[Replica], tokens: int, cap: float,
              warm: Callable[[Replica | None], int] = lambda replica: 0) -> Replica:
    """The replica of `free` within `cap` with the least load, the request's work there
    included (less what it holds of the prompt), weighed by its KV pressure; then the
    least pressure, the lowest name. The least loaded free replica is always within
    `cap`: never empty."""
    return min((r for r in free if r.load_tokens + tokens <= cap),
               key=lambda r: ((r.load_tokens + tokens - min(warm(r), tokens)) * (1 + r.penalty),
                              r.penalty, r.name))


def pick(replicas: Sequence[Replica], tokens: int, *, mode: PickMode = PickMode.AFFINITY,
         prefix: Match = NO_MATCH, session: str | None = None, epsilon: float = EPSILON,
         cursor: int = 0, warm_tokens: int = 0,
         held: Mapping[str, int] | None = None) -> Pick | None:
    """The replica to run a request of `tokens` (prompt plus expected output) on, among
    `replicas` that are healthy with a free slot; None when there is none (it waits).

    `prefix`: the table's longest match for the request's prompt, `warm_tokens` the prompt
    tokens that match covers; `held`: the blocks of that prefix each replica holds (the
    table's `held`; None: only `prefix.replica`, all of them). Affinity prefers the free
    replica holding the most; there its blocks are not prefilled again, so the request
    adds only the rest to its load. `session`: its session key. `cursor`: round robin's
    position (the previous pick's `cursor`, or any counter). A replica affinity or the
    turn would choose gives way to the lightest within the bound (reason BOUND), the
    warmest first, when it is over the bound and another is not.
    """
    free = [r for r in replicas if r.healthy and r.active < r.slots]
    if not free:
        return None
    # Never below the least loaded free replica: when all are over the bound, the
    # preferred one may stay if no other is lighter.
    cap = max(bound(replicas, tokens, epsilon), min(r.load_tokens for r in free) + tokens)
    warm = _warmth(prefix, warm_tokens, held)
    preferred, reason = _preferred(replicas, free, mode, prefix, session, cursor, warm)
    adds = tokens - min(warm(preferred), tokens) if reason is PickReason.PREFIX else tokens
    if preferred is None:
        chosen = _lightest(free, tokens, cap, warm)
    elif preferred.load_tokens + adds <= cap:
        chosen = preferred
    else:
        chosen, reason = _lightest(free, tokens, cap, warm), PickReason.BOUND
    position = next(i for i, replica in enumerate(replicas) if replica is chosen)
    return Pick(chosen.name, reason, position + 1)


def _warmth(prefix: Match, warm_tokens: int,
            held: Mapping[str, int] | None) -> Callable[[Replica | None], int]:
    """The prompt tokens a replica holds: `warm_tokens` for the whole known prefix, its
    share for fewer blocks."""
    if not prefix.blocks or prefix.replica is None:
        return lambda replica: 0
    blocks = held if held is not None else {prefix.replica: prefix.blocks}
    return lambda replica: (0 if replica is None else
                            warm_tokens * blocks.get(replica.name, 0) // prefix.blocks)


def _preferred(replicas: Sequence[Replica], free: Sequence[Replica], mode: PickMode,
               prefix: Match, session: str | None, cursor: int,
               warm: Callable[[Replica | None], int]) -> tuple[Replica | None, PickReason]:
    """The replica the mode names before load is weighed, and why (None: no preference)."""
    if mode is PickMode.ROUND_ROBIN:
        start = cursor % len(replicas)
        turn = next(r for r in (*replicas[start:], *replicas[:start]) if r.free)
        return turn, PickReason.ROUND_ROBIN
    if mode is PickMode.LEAST_LOADED:
        return None, PickReason.LEAST_LOADED
    if mode is PickMode.POWER_OF_TWO:  # drawn by the cursor and the group's load: pure
        seed = hash((cursor, sum(r.load_tokens for r in replicas))) & _MASK
        two = heapq.nlargest(2, free, key=lambda r: _weight(seed, r.name))
        return min(two, key=lambda r: (r.load_tokens * (1 + r.penalty), r.name)), \
            PickReason.POWER_OF_TWO
    if prefix.blocks and prefix.replica is not None:
        warmest = min(free, key=lambda r: (-warm(r), r.name != prefix.replica,
                                           r.load_tokens, r.name))
        if warmest.name == prefix.replica or warm(warmest) > 0:
            return warmest, PickReason.PREFIX
    if session is not None:
        name = rendezvous(session, [r.name for r in free])
        return next(r for r in free if r.name == name), PickReason.SESSION
    return None, PickReason.LEAST_LOADED
