"""The waiters of a `LocalSlotPool` pinned to a replica for a while (`enqueue(hold_s=...)`:
the scheduler found waiting for the replica that holds their prompt's prefix sooner than a
cold prefill elsewhere): how many there are, the timer that ends each one's patience, and
the hand-off of free slots while some are pinned. Only a grouped pool with a FIFO line
pins (a fair line's order is its own). The pool owns the lines and the seats; no I/O (the
timers are the event loop's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from policies.slots.fair import FairLine
from policies.slots.line import Line
from policies.slots.local_tickets import LocalLease, LocalTicket

Lines = tuple[Line[LocalTicket], ...] | tuple[FairLine, ...]  # one per class, in class order
# A slot freed on a replica goes to a waiter pinned to it among the first this many of a
# class, past those ahead of it (who take any replica's next slot).
PIN_WINDOW = 32


class Seating(Protocol):
    """What the hand-off asks of its pool (`policies.slots.local`), named here so that this
    module need not import it."""

    @property
    def _lines(self) -> Lines: ...

    def _free_seats(self, prefer: Sequence[str]) -> list[str]: ...

    def _takes(self, replica: str | None) -> bool: ...

    def _take(self, replica: str, now: float, max_tokens: int | None = None) -> LocalLease: ...


class PinnedWaiters:
    """A pool's waiters pinned to a replica: their count, and who takes a free slot."""

    __slots__ = ("_pool", "count")

    def __init__(self, pool: Seating) -> None:
        self._pool = pool
        self.count = 0

    def pin(self, ticket: LocalTicket, hold_s: float,
            over: Callable[[LocalTicket], None]) -> None:
        """`ticket` takes a slot on its `want` alone for `hold_s`, then `over(ticket)`."""
        ticket.pin = ticket._future.get_loop().call_later(hold_s, over, ticket)
        self.count += 1

    def unpin(self, ticket: LocalTicket) -> bool:
        """`ticket` takes any replica from now on (its patience is over, it was served or
        it left); False when it was not pinned."""
        if ticket.pin is None:
            return False
        ticket.pin.cancel()
        ticket.pin = None
        self.count -= 1
        return True

    def fill(self, now: float, prefer: Sequence[str]) -> None:
        """The pool's `_fill` while some wait pinned: each free slot (`prefer`'s replicas
        first) goes to the waiter `taker` says; a slot no waiter takes stays free (for a
        newcomer)."""
        pool = self._pool
        granted = True
        while granted:
            granted = False
            for replica in pool._free_seats(prefer):
                ticket = self.taker(replica)
                if ticket is not None:
                    pool._lines[ticket.rank].remove(ticket)
                    self.unpin(ticket)
                    ticket._future.set_result(pool._take(replica, now, ticket.max_tokens))
                    granted = True
                    break

    def taker(self, replica: str) -> LocalTicket | None:
        """The waiter a slot freed on `replica` goes to (None: no one takes it): the first
        pinned to it among the first `PIN_WINDOW` of a class, else the first that takes any
        replica (or is pinned to one that takes no work)."""
        first = None
        takes = self._pool._takes
        for line in self._pool._lines:
            for seen, ticket in enumerate(line.tickets):
                if ticket._future.done():
                    continue
                if ticket.pin is not None and ticket.want == replica:
                    return ticket
                if first is None and (ticket.pin is None or not takes(ticket.want)):
                    first = ticket
                if first is not None and seen >= PIN_WINDOW:
                    break
            if first is not None:
                return first
        return None

    def pinned_to(self, replica: str) -> list[int | None]:
        """The answers' caps (`max_tokens`) of the waiters pinned to `replica`, in line
        order: what a newcomer pinned to it waits behind."""
        return [ticket.max_tokens for line in self._pool._lines for ticket in line.tickets
                if ticket.pin is not None and ticket.want == replica]
