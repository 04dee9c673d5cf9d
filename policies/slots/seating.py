"""A shared pool's group of engine replicas as one process sees it.

Each replica's slots come from the config and its health from this process's breakers;
its holders are what Redis last said (every script's reply and every wake-up carries
them), so reading the seats costs no round trip. The scripts are passed the healthy
replicas with slots, in the order of preference (`offer`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from policies.slots.base import Seats


class GroupView:
    """The replicas of one shared pool: slots, health here, holders as last heard."""

    def __init__(self, replicas: Mapping[str, int]) -> None:
        self.slots = dict(replicas)
        self.unhealthy: set[str] = set()
        self.held: dict[str, int] = {}  # as Redis last said; absent: none

    @property
    def capacity(self) -> int:
        return sum(n for name, n in self.slots.items() if name not in self.unhealthy)

    @property
    def held_on_unhealthy(self) -> int:
        return sum(self.held.get(name, 0) for name in self.unhealthy)

    def offer(self, prefer: Sequence[str] = ()) -> list[str | int]:
        """(name, slots) pairs, flat, of the healthy replicas: `prefer`'s first, then the
        rest in config order."""
        order = [name for name in prefer if name in self.slots]
        order += [name for name in self.slots if name not in order]
        out: list[str | int] = []
        for name in order:
            if name not in self.unhealthy and self.slots[name] > 0:
                out += [name, self.slots[name]]
        return out

    def seats(self) -> tuple[Seats, ...]:
        """Each configured replica, then any removed one still running out its holders."""
        configured = tuple(Seats(name, n, self.held.get(name, 0), name not in self.unhealthy)
                           for name, n in self.slots.items())
        leaving = tuple(Seats(name, 0, n) for name, n in self.held.items()
                        if name not in self.slots and n > 0)
        return configured + leaving

    def set_healthy(self, replica: str, healthy: bool) -> bool:
        """Whether that changed anything."""
        if replica not in self.slots or (replica not in self.unhealthy) == healthy:
            return False
        if healthy:
            self.unhealthy.discard(replica)
        else:
            self.unhealthy.add(replica)
        return True

    def resize(self, replicas: Mapping[str, int], unready: Collection[str] = ()) -> None:
        """New seats; a replica in `unready` is unhealthy (not yet checked)."""
        self.unhealthy |= set(unready)
        self.slots = dict(replicas)
        self.unhealthy &= set(self.slots)


def from_reply(flat: Sequence[bytes | str | int]) -> dict[str, int]:
    """A script's {seats}: name, holders, name, holders..."""
    return {_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def from_message(text: bytes) -> dict[str, int]:
    """A wake-up's seats: `name=holders` joined by commas."""
    return dict(_pair(part) for part in text.decode().split(",") if part)


def _pair(part: str) -> tuple[str, int]:
    name, _, held = part.rpartition("=")
    return name, int(held)


def _text(value: bytes | str | int) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Seat:
    """One replica's slots in a local pool; `slots` 0 once a reload removed it (it runs
    out what it holds); not `healthy` while its breaker is open or it awaits its first
    health check."""

    __slots__ = ("active", "healthy", "slots")

    def __init__(self, slots: int, healthy: bool = True) -> None:
        self.slots, self.active, self.healthy = slots, 0, healthy

    @property
    def free(self) -> bool:
        return self.healthy and self.active < self.slots
