"""Shared pieces of the config models: the strict base model, key paths, and the
enums several sections use (a caller's priority, a route's overflow).

Pure data and validation: no YAML, no files, no environment lookups.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

# A key path into the config document, as pydantic spells it: ("routes", "chat", "fallbacks", 1).
Loc = tuple[str | int, ...]

# The error type of cross-reference problems, so a loader can tell whether they were checked.
CROSS_REFERENCE = "cross_reference"

PositiveSeconds = Annotated[float, Field(gt=0, le=86_400)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Priority(enum.StrEnum):
    """A caller's class in the queues: higher classes are served first, FIFO within one;
    `sheddable` waiters are the first to give up their place when a queue is full."""

    CRITICAL = "critical"
    STANDARD = "standard"
    SHEDDABLE = "sheddable"

    @property
    def rank(self) -> int:  # 0 is served first
        return _PRIORITY_RANK[self]


_PRIORITY_RANK = {Priority.CRITICAL: 0, Priority.STANDARD: 1, Priority.SHEDDABLE: 2}


class Overflow(enum.StrEnum):
    """What a route does when its primary's queue is full."""

    FALLBACK = "fallback"
    REJECT = "reject"
