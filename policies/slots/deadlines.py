"""One timer for the deadlines of every waiter of a pool's line.

A timer of its own per waiter (a `TimerHandle`, its callback and context) was about
0.7 KiB of each queued request's memory. Here the deadlines wait in a heap, and the loop
holds one timer, for the earliest. A waiter that leaves its line before its deadline
leaves its entry behind, counted; entries of waiters gone are dropped when their time
comes, or all at once when they are most of the heap, or when none is left waiting (so an
idle pool holds no timer).
"""

from __future__ import annotations

import asyncio
import heapq
import math
from typing import Protocol


class Expiring(Protocol):
    """A waiter whose place in line ends at its deadline (`LocalTicket`)."""

    timed: bool  # its deadline is in the heap and counts

    def _expire(self) -> None: ...


class Deadlines:
    __slots__ = ("_at", "_gone", "_heap", "_made", "_timer")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Expiring]] = []
        self._made = 0  # entries made: the tie-break of equal deadlines (first in, first out)
        self._gone = 0  # entries whose waiter left before its deadline
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf  # when the timer fires

    def add(self, waiter: Expiring, timeout_s: float) -> None:
        """`waiter` expires `timeout_s` from now unless it leaves first (`left`)."""
        loop = asyncio.get_running_loop()
        when = loop.time() + timeout_s
        self._made += 1
        heapq.heappush(self._heap, (when, self._made, waiter))
        waiter.timed = True
        if when < self._at:
            self._arm(loop, when)

    def left(self, waiter: Expiring) -> None:
        """`waiter` left its line: its deadline no longer counts."""
        if not waiter.timed:
            return
        waiter.timed = False
        self._gone += 1
        heap = self._heap
        if self._gone == len(heap):  # no one is left waiting
            heap.clear()
            self._gone = 0
            self._disarm()
        elif self._gone > 64 and 2 * self._gone > len(heap):
            self._heap = [entry for entry in heap if entry[2].timed]
            heapq.heapify(self._heap)
            self._gone = 0

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        self._disarm()
        self._at = when
        self._timer = loop.call_at(when, self._fire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._at = math.inf

    def _fire(self) -> None:
        self._timer, self._at = None, math.inf
        loop = asyncio.get_running_loop()
        now, heap = loop.time(), self._heap
        while heap and heap[0][0] <= now:
            waiter = heapq.heappop(heap)[2]
            if waiter.timed:
                waiter.timed = False
                waiter._expire()
            else:
                self._gone -= 1
        if heap:
            self._arm(loop, heap[0][0])
