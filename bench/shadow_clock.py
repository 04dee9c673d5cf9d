"""What the shadows' calls teach the 70B's clock (bench/shadow_share.py): the hold its
forecasts use, sampled on both gateways of a pair while the traffic runs, and the waits
it forecast to interactive clients in line beside the waits they had.

A shadow's call settles like any request on its backend: its hold (a judgement's one
token, a call cut at an interactive arrival) is one more sample of the pool's holds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from batch_gateway import PRIMARY, BenchGateway
from batch_traffic import Stream

SAMPLE_S = 1.0


@dataclass
class Holds:
    """The 70B's hold model, one sample per second per gateway: the mean of the
    distribution its wait forecasts use, and its running mean (the objective's)."""

    forecast: list[float] = field(default_factory=list)
    running: list[float] = field(default_factory=list)

    def read(self, gw: BenchGateway) -> None:
        holds = gw.running.gateway.backends[PRIMARY].clock.holds
        self.forecast.append(holds.distribution().mean_s)
        self.running.append(holds.mean_s)

    def __add__(self, other: Holds) -> Holds:
        return Holds(self.forecast + other.forecast, self.running + other.running)


async def sample(off: BenchGateway, on: BenchGateway, until: float) -> tuple[Holds, Holds]:
    """Both gateways' hold models every second until `until` (time.monotonic)."""
    held = Holds(), Holds()
    while time.monotonic() < until:
        await asyncio.sleep(SAMPLE_S)
        held[0].read(off)
        held[1].read(on)
    return held


def eta_errors(streams: Sequence[Stream], least_s: float) -> list[float]:
    """Forecast - actual wait (s) of the streams that waited in the 70B's line longer
    than `least_s` (shorter: a slot a shadow's call gave back)."""
    return [s.eta_s - s.queue_wait_ms / 1000 for s in streams
            if s.backend == PRIMARY and s.eta_s is not None and s.queue_wait_ms is not None
            and s.queue_wait_ms > least_s * 1000]
