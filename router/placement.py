"""Which replica of a backend's group a request prefers, and the accounting that follows
its slot: the replica's token work in flight and the prefix table.

The decision is `policies.scheduler.pick.pick` over a snapshot of the group's seats and loads; the
pool then grants the first free slot in that preference, atomically. A group of one
skips all of it. A waiter takes the replica whose slot freed first (the line is the
group's), and its prompt's blocks are recorded there all the same, once the engine has
prefilled them (`prefilled`: its first byte), not when the slot is granted: until then the
replica's cache does not hold them, and a request sent there for them would prefill them
again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from policies.clock.lengths import OUTPUT_PRIOR
from policies.scheduler import pick
from policies.scheduler.prefix import NO_MATCH, Match, block_hashes, request_text
from policies.slots import Lease
from router.backend import Backend
from router.common.parsed import ParsedRequest

BYTES_PER_TOKEN = 4  # as the prompt's token estimate counts them


@dataclass(slots=True)
class Placement:
    """What a request brings to a group's pick: its prompt's block hashes, its token work
    (prompt and expected output) and its session key."""

    hashes: list[int]
    tokens: int
    session: str | None
    block_bytes: int  # the block size the hashes were cut with


def placement(parsed: ParsedRequest, session_header: str | None, block_bytes: int,
              prompt: int) -> Placement:
    """`prompt`: the request's prompt tokens as every estimate counts them (the body's,
    `Exchange.prompt_tokens`)."""
    text = request_text(parsed.body)
    output = parsed.max_tokens if parsed.max_tokens is not None else OUTPUT_PRIOR
    return Placement(block_hashes(text, block_bytes), prompt + output,
                     pick.session_key(session_header, parsed.body.get("user")), block_bytes)


class Preference(NamedTuple):
    """What a group's pick says of a request."""

    first: tuple[str, ...]  # the replica to try first (empty: any)
    reason: str | None  # why (a `PickReason`; None when no replica is free)
    known: int | None  # the prompt's blocks the affinity table knew (None: not looked up)
    holder: str | None  # the replica that holds them, which a waiter would rather have
    hold: pick.Hold | None = None  # wait for the holder (busy) rather than run elsewhere

    @property
    def hold_s(self) -> float:
        """How long to wait for the holder alone (0: no wait for it)."""
        return 0.0 if self.hold is None else self.hold.patience_s


def preference(backend: Backend, place: Placement, avoid: Sequence[str] = ()) -> Preference:
    """The pick of `backend`'s group (more than one replica: the scheduler's view asks
    only of those) for `place`. Replicas in `avoid` (the request failed there) are picked
    only when nothing else is free."""
    replicas, readings = backend.replicas, backend.readings
    stale_s, now = backend.config.signals.stale_after_s, time.monotonic()
    snapshot = [pick.Replica(s.name, s.slots, s.active,
                             replicas[s.name].load_tokens if s.name in replicas else 0,
                             s.healthy and s.name not in avoid,
                             readings[s.name].penalty(stale_s, now) if s.name in readings
                             else 0.0)
                for s in backend.pool.seats()]
    table = backend.affinity
    config = backend.config
    match = table.match(place.hashes) if table is not None else NO_MATCH
    held = table.held(place.hashes) if match.blocks and table is not None else {}
    choice = pick.pick(snapshot, place.tokens, mode=config.pick, prefix=match,
                       session=place.session, epsilon=config.affinity.load_bound,
                       cursor=backend.cursor,
                       warm_tokens=match.blocks * place.block_bytes // BYTES_PER_TOKEN,
                       held=held)
    known = match.blocks if table is not None else None
    if match.replica is not None and backend.pool.pins and (
            choice is None or choice.replica != match.replica):
        hold = _hold(backend, place, snapshot, match, held, choice)
        if hold is not None:
            return Preference((), pick.PickReason.HOLD.value, known, hold.replica, hold)
    if choice is None:
        return Preference((), None, known, match.replica)
    backend.cursor = choice.cursor
    return Preference((choice.replica,), choice.reason.value, known, match.replica)


def _hold(backend: Backend, place: Placement, snapshot: Sequence[pick.Replica],
          match: Match, held: Mapping[str, int], choice: pick.Pick | None) -> pick.Hold | None:
    """Would the request rather wait for the busy replica holding its longest prefix
    (`pick.hold_out`)? What waiting saves is the prefill of the blocks it holds beyond
    those of the replica the request would run on now (`choice`), or, with none free,
    of the warmest other, at that replica's own prefill rate (the group's for a
    replica not yet learned, or with none free and no other warm: the next slot may
    free anywhere). With none free, that prefill would also hold a slot the waiters
    need: it delays each of them by its share, so it counts that much more. The wait
    for the holder runs at the holder's own stream rates (`Clock.rates_on`)."""
    pool, clock, holder = backend.pool, backend.clock, match.replica
    assert holder is not None
    cold: str | None  # where the cold prefill would run
    if choice is not None:
        other_s, cold, crowd = 0.0, choice.replica, 0.0
    else:  # the group's next slot for a newcomer behind the waiters that take any
        line = pool.snapshot()
        other_s = pool.forecast(max(1, line.queued - line.pinned + 1))
        cold = max((name for name in held if name != holder), key=held.__getitem__,
                   default=None)
        crowd = line.queued / max(line.capacity, 1)
    other = 0 if cold is None else held.get(cold, 0)
    tokens_per_block = place.block_bytes // BYTES_PER_TOKEN
    warm = min(match.blocks * tokens_per_block, place.tokens)
    saved = min((match.blocks - other) * tokens_per_block, warm)
    return pick.hold_out(snapshot, place.tokens, match, warm, saved * clock.prefill_on(cold),
                         lambda: pool.replica_wait(holder, clock.rates_on(holder)), other_s,
                         backend.config.affinity.load_bound, crowd)


def placed(backend: Backend, lease: Lease, place: Placement | None) -> int:
    """The request runs on `lease.replica`: count its work there; returns the tokens to
    give back when it ends (`unplaced`). Its work is what the engine must do: the prompt
    tokens it does not hold (the known prefix there is not prefilled again, as the pick
    counts it) and the answer."""
    replica = backend.replicas.get(lease.replica)
    if replica is None or place is None:
        return 0
    work = place.tokens
    table = backend.affinity
    if table is not None and place.hashes:
        match = table.match(place.hashes)
        if match.replica == lease.replica:
            work -= min(match.blocks * place.block_bytes // BYTES_PER_TOKEN, work)
    replica.load_tokens += work
    return work


def prefilled(backend: Backend, replica: str, place: Placement | None) -> None:
    """The engine of `replica` has prefilled the request's prompt (its first byte came):
    its cache now holds the prompt's blocks, and the table says so."""
    table = backend.affinity
    if table is not None and place is not None and place.hashes:
        table.record(place.hashes, replica)


def unplaced(backend: Backend, lease: Lease, tokens: int) -> None:
    replica = backend.replicas.get(lease.replica)
    if replica is not None:
        replica.load_tokens -= tokens
