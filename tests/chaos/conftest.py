"""Chaos tests: many clients and faults at random (seeded) moments.

SLOTGATE_CHAOS_SCALE multiplies their size (default 1: the size `make test` runs).
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def scale() -> int:
    value = int(os.environ.get("SLOTGATE_CHAOS_SCALE", "1"))
    assert value >= 1, "SLOTGATE_CHAOS_SCALE must be a positive integer"
    return value
