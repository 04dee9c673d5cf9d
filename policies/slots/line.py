"""One priority class's FIFO line of a local pool, with a ticket's place found in O(log n).

No I/O; the pool (`policies.slots.local`) owns the lines and what their tickets mean.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    """A ticket as the line sees it: hashable, numbered by the line when it joins."""

    seq: int


T = TypeVar("T", bound=Queued)


class Line(Generic[T]):
    """One class's FIFO line. A ticket's place is found in O(log n), not by a walk: it is
    its sequence number less the head's, less the tickets that left from the middle."""

    __slots__ = ("_gaps", "_next", "tickets")

    def __init__(self) -> None:
        self.tickets: OrderedDict[T, None] = OrderedDict()
        self._next = 0
        self._gaps: list[int] = []  # sequence numbers of tickets gone from behind the head

    def __len__(self) -> int:
        return len(self.tickets)

    def append(self, ticket: T) -> None:
        ticket.seq, self._next = self._next, self._next + 1
        self.tickets[ticket] = None

    def pop_head(self) -> T:
        ticket, _ = self.tickets.popitem(last=False)
        if self._gaps and self.tickets:  # forget gaps the head has passed
            del self._gaps[:bisect_left(self._gaps, next(iter(self.tickets)).seq)]
        elif not self.tickets:
            self._gaps.clear()
        return ticket

    def pop_tail(self) -> T:
        ticket = next(reversed(self.tickets))
        self.remove(ticket)
        return ticket

    def remove(self, ticket: T) -> bool:
        if ticket not in self.tickets:
            return False
        if next(iter(self.tickets)) is ticket:
            self.pop_head()
        else:
            del self.tickets[ticket]
            insort(self._gaps, ticket.seq)
        return True

    def in_order(self) -> Iterable[T]:
        """The tickets in the order they will be served (`FairLine`'s face too)."""
        return self.tickets

    def position(self, ticket: T) -> int:
        """1 for the head; 0 when not in this line."""
        if ticket not in self.tickets:
            return 0
        head = next(iter(self.tickets)).seq
        gone = bisect_left(self._gaps, ticket.seq) - bisect_left(self._gaps, head)
        return ticket.seq - head - gone + 1
