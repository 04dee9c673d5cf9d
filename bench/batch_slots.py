"""Slot-seconds of the 70B over a window, split between interactive requests and batch
lines, two ways that should agree: from the simulated engine's own records (each
request's [start, end] on the engine) and from the gateway's ledger rows (each request's
slot time, ending where its total time ends). Batch lines are known on the engine by
their request id (`<job id>-<line>`, or another test of it), in the ledger by its batch
mark (the gateway's own work of no key, shadow comparisons included, is marked so too); a
line cut to give its slot back counts as batch time too, and is shown apart as the work
thrown away.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from router.upstream.simulated.engine import SimRecord

BATCH_PREFIX = "batch_"


@dataclass(frozen=True)
class Window:
    start: float  # time.monotonic
    end: float
    unix_start: float  # time.time at `start`: the ledger's clock

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def overlap(self, begin: float, end: float) -> float:
        return max(0.0, min(end, self.end) - max(begin, self.start))


@dataclass(frozen=True)
class SlotSeconds:
    capacity: float  # slots x the window
    interactive: float
    batch: float
    cut: float  # of `batch`: lines that gave their slot back and ran again

    @property
    def idle(self) -> float:
        """What the interactive traffic left."""
        return self.capacity - self.interactive

    @property
    def share(self) -> float:
        """Of the idle slot-seconds, the share the batch held."""
        return self.batch / self.idle if self.idle > 0 else float("nan")

    @property
    def kept_share(self) -> float:
        """Of the idle slot-seconds, the share the batch held with lines it finished."""
        return (self.batch - self.cut) / self.idle if self.idle > 0 else float("nan")


def is_batch_line(request_id: str) -> bool:
    return request_id.startswith(BATCH_PREFIX)


def from_engine(records: Iterable[SimRecord], window: Window, slots: int, now: float,
                batch_id: Callable[[str], bool] = is_batch_line) -> SlotSeconds:
    """Each engine request's time between its arrival there and its end (one still
    running counts to `now`), clipped to the window; `batch_id(request_id)`: whether it
    is the batch's."""
    interactive = batch = cut = 0.0
    for rec in records:
        held = window.overlap(rec.started_at, rec.ended_at if rec.ended_at else now)
        if batch_id(rec.request_id):
            batch += held
            cut += held if rec.aborted else 0.0
        else:
            interactive += held
    return SlotSeconds(slots * window.seconds, interactive, batch, cut)


@dataclass(frozen=True)
class Row:
    """A ledger row of the 70B, its slot placed on the bench's clock."""

    request_id: str
    slot_start: float  # time.monotonic
    slot_end: float
    queue_wait_s: float
    status: int
    batch: bool  # the ledger's mark: a batch line, or the gateway's own work of no key


def ledger_rows(path: Path, window: Window, backend: str) -> list[Row]:
    """Each row's slot time, taken to end where the request ended (`ts` + total time)."""
    with sqlite3.connect(path) as db:
        found = db.execute("SELECT request_id, ts, total_ms, slot_ms, queue_wait_ms, status, "
                           "batch FROM requests WHERE backend = ?", (backend,)).fetchall()
    rows = []
    for request_id, ts, total_ms, slot_ms, queue_wait_ms, status, batch in found:
        end = ts - window.unix_start + window.start + total_ms / 1000
        rows.append(Row(str(request_id), end - slot_ms / 1000, end, queue_wait_ms / 1000,
                        int(status), bool(batch)))
    return rows


def from_ledger(rows: Iterable[Row], window: Window, slots: int) -> SlotSeconds:
    """The rows' slot times clipped to the window (a request refused held none)."""
    interactive = batch = cut = 0.0
    for row in rows:
        held = window.overlap(row.slot_start, row.slot_end)
        if row.batch:
            batch += held
            cut += held if row.status == 499 else 0.0
        else:
            interactive += held
    return SlotSeconds(slots * window.seconds, interactive, batch, cut)


def taken_while_waiting(rows: Sequence[Row]) -> int:
    """Batch lines that took a slot while an interactive request waited in line for one
    (its wait: the queue wait before its slot)."""
    waits = [(r.slot_start - r.queue_wait_s, r.slot_start) for r in rows
             if not r.batch and r.queue_wait_s > 0]
    return sum(1 for r in rows if r.batch and r.slot_end > r.slot_start and any(
        begin < r.slot_start < end for begin, end in waits))


def lines_ended(records: Iterable[SimRecord], window: Window) -> tuple[int, int]:
    """Batch lines that ended in the window on the engine: (answered, cut)."""
    done = cut = 0
    for rec in records:
        if rec.request_id.startswith(BATCH_PREFIX) and rec.ended_at is not None \
                and window.start <= rec.ended_at < window.end:
            done += rec.completed
            cut += rec.aborted
    return done, cut


def mean_hold(records: Iterable[SimRecord], ids: set[str]) -> float:
    """The mean engine time of the finished requests in `ids`."""
    held = [r.ended_at - r.started_at for r in records
            if r.request_id in ids and r.ended_at is not None and r.completed]
    return sum(held) / len(held) if held else float("nan")
