"""The bytes of request bodies the process holds in memory, and each request's share.

A body counts from before it is read (its declared Content-Length, or chunk by chunk when
it has none) until its request ends: the parsed form stays with the request while it
queues and is forwarded. A share that would pass the bound is refused at once (the
caller's 503 + Retry-After), before more of the body is read.
"""

from __future__ import annotations

from collections.abc import Callable


class InflightBodies:
    """The bytes of request bodies the process holds now."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = 0


class BodyHold:
    """One request's share of `InflightBodies`; `release` gives it back (in a finally)."""

    __slots__ = ("bodies", "limit", "refusal", "size")

    def __init__(self, bodies: InflightBodies, limit: int,
                 refusal: Callable[[], Exception]) -> None:
        self.bodies, self.limit, self.refusal, self.size = bodies, limit, refusal, 0

    def take(self, size: int) -> None:
        """Count `size` more bytes in, or raise `refusal()` if they would pass the bound."""
        bodies = self.bodies
        if bodies.held + size > self.limit:
            raise self.refusal()
        bodies.held += size
        self.size += size

    def release(self) -> None:
        self.bodies.held -= self.size
        self.size = 0
