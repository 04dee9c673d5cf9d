"""What the shadow bench (bench/shadow_share.py) reads of the gateway that runs shadows:
its /metrics (slotgate_shadows_total, slotgate_shadow_verdicts_total), the 70B engine's
records of the shadows' calls, the ledger's verdicts, and a wait for the runner to finish
what it holds once the traffic has stopped.

A shadow's calls (its replay, then the judge's two) reach the engine with a request id
the gateway made, where the bench's own requests carry theirs (`ia-<n>`); in the ledger
they are the rows marked batch of no key (the bench has no batch job).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path

import aiohttp
from batch_slots import Row, SlotSeconds, Window
from batch_traffic import Stream
from prometheus_client.parser import text_string_to_metric_families
from shadow_clock import Holds

from router.quality.shadows import JUDGE_MAX_TOKENS, ShadowRunner
from router.upstream.simulated.engine import SimRecord

CLIENT_PREFIX = "ia-"  # the ids of the bench's interactive requests


def is_shadow(request_id: str) -> bool:
    """On the engine: not a request the bench sent (the gateway made its id)."""
    return not request_id.startswith(CLIENT_PREFIX)


@dataclass(frozen=True)
class Counts:
    """The shadow series of one /metrics scrape (outcome -> n, verdict -> n)."""

    outcomes: dict[str, float]
    verdicts: dict[str, float]
    waiting: float  # slotgate_shadows_waiting

    @property
    def judged(self) -> int:
        return int(sum(self.verdicts.values()))

    def skipped(self) -> int:
        return int(sum(n for k, n in self.outcomes.items() if k.startswith("skipped:")))

    def __add__(self, other: Counts) -> Counts:
        return Counts(_merged(self.outcomes, other.outcomes),
                      _merged(self.verdicts, other.verdicts), self.waiting + other.waiting)


def _merged(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in a.keys() | b.keys()}


async def scrape(session: aiohttp.ClientSession, url: str) -> Counts:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    outcomes: dict[str, float] = {}
    verdicts: dict[str, float] = {}
    waiting = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "slotgate_shadows_total":
                outcomes[s.labels["outcome"]] = s.value
            elif s.name == "slotgate_shadow_verdicts_total":
                verdicts[s.labels["verdict"]] = s.value
            elif s.name == "slotgate_shadows_waiting":
                waiting = s.value
    return Counts(outcomes, verdicts, waiting)


async def drain(runner: ShadowRunner, limit_s: float) -> float:
    """Wait (at most `limit_s`) until no shadow waits and none is in flight; the time
    it took, or `limit_s` if some were still held then."""
    began = time.monotonic()
    while runner.pending or runner.busy:
        if time.monotonic() - began >= limit_s:
            return limit_s
        await asyncio.sleep(0.25)  # the bench's own look, not the gateway's
    return time.monotonic() - began


@dataclass(frozen=True)
class Calls:
    """The shadows' calls on the engine: answered replays, answered judgements (an answer
    of at most the judge's tokens), and cut ones (an interactive request took the slot);
    and the slot-seconds each kind held in all (window or not)."""

    replays: int
    judges: int
    cut: int
    replay_s: float
    judge_s: float
    cut_s: float

    @property
    def seconds(self) -> float:
        return self.replay_s + self.judge_s + self.cut_s

    def __add__(self, other: Calls) -> Calls:
        return Calls(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


def slot_sum(parts: Iterable[SlotSeconds]) -> SlotSeconds:
    """The slot-seconds of several engines, as of one with all their slots."""
    parts = list(parts)
    return SlotSeconds(*(sum(getattr(p, f.name) for p in parts) for f in fields(SlotSeconds)))


def shadow_calls(records: Iterable[SimRecord]) -> Calls:
    counts = [0, 0, 0]
    held = [0.0, 0.0, 0.0]
    for rec in records:
        if not is_shadow(rec.request_id) or rec.ended_at is None:
            continue
        kind = 2 if rec.aborted else 1 if rec.completion_tokens <= JUDGE_MAX_TOKENS else 0
        counts[kind] += 1
        held[kind] += rec.ended_at - rec.started_at
    return Calls(counts[0], counts[1], counts[2], held[0], held[1], held[2])


def preemptors(records: Iterable[SimRecord], within_s: float) -> set[str]:
    """The bench's requests that took a cut shadow call's slot: for each cut call, the
    request that started on the engine nearest its end, within `within_s`."""
    records = list(records)
    mine = [r for r in records if not is_shadow(r.request_id)]
    out = set()
    for cut in records:
        if not (is_shadow(cut.request_id) and cut.aborted and cut.ended_at is not None):
            continue
        end = cut.ended_at
        near = min(mine, key=lambda r: abs(r.started_at - end), default=None)
        if near is not None and abs(near.started_at - end) <= within_s:
            out.add(near.request_id)
    return out


def waited_beside_shadow(rows: Iterable[Row], tolerance_s: float) -> int:
    """Interactive requests that waited in line longer than `tolerance_s` (a hand-off's
    cost) while a shadow's call held a slot: a slot the shadow should have given back."""
    rows = list(rows)
    held = [(r.slot_start, r.slot_end) for r in rows if r.batch]
    out = 0
    for r in rows:
        if r.batch or r.queue_wait_s <= tolerance_s:
            continue
        begin, end = r.slot_start - r.queue_wait_s, r.slot_start - tolerance_s
        out += any(s < end and e > begin + tolerance_s for s, e in held)
    return out


def moved(path: Path, window: Window) -> int:
    """Requests of the window the route moved to a small model for being simple."""
    with sqlite3.connect(path) as db:
        found = db.execute("SELECT COUNT(*) FROM requests WHERE reason LIKE 'fallback:simple:%' "
                           "AND ts >= ? AND ts < ?",
                           (window.unix_start, window.unix_start + window.seconds)).fetchone()
    return int(found[0])


def verdicts_kept(path: Path) -> dict[str, int]:
    """The ledger's verdicts by verdict (none: unreadable)."""
    with sqlite3.connect(path) as db:
        found = db.execute("SELECT COALESCE(verdict, 'none'), COUNT(*) FROM verdicts "
                           "GROUP BY 1").fetchall()
    return {str(v): int(n) for v, n in found}


NO_SLOTS = SlotSeconds(0.0, 0.0, 0.0, 0.0)


@dataclass
class Measured:
    """One pair's figures: its streams, and what its shadow gateway did."""

    off: list[Stream]  # the streams of the gateway without shadows
    on: list[Stream]  # and of the one with them
    holds: tuple[Holds, Holds]  # their 70B's hold models through the traffic: off, on
    simple: int  # prompts of the schedule that were the demo's simple ones
    counts: Counts
    slots: SlotSeconds  # of the 70B over the window, shadows on: engine
    calls: Calls
    preempted: int  # shadow calls cut for an interactive request, whole run
    preemptors: set[str]  # the interactive requests that took their slots (engine)
    # From the ledgers, once the gateways have closed
    moved: tuple[int, int] = (0, 0)  # by the classifier in the window: off, on
    verdicts_kept: dict[str, int] = field(default_factory=dict)
    ledger_slots: SlotSeconds = NO_SLOTS
    shadow_rows: int = 0  # ledger rows of the 70B marked batch (the shadows' calls)
    took_slot_while_waiting: int = 0  # must be 0
    waited_beside_shadow: int = 0  # must be 0
