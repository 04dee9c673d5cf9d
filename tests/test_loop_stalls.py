"""`slotgate_event_loop_stall_seconds`: a callback that holds the event loop is seen as a
stall of about its length (past 100 ms for a 150 ms hold)."""

from __future__ import annotations

import asyncio
import time

from router.app import RunningGateway
from tests.support import StartGateway, gateway_config, sim_backend

HOLD_S = 0.15  # what the blocking callback takes (the stall itself, not a synchronisation)


def stalls(gw: RunningGateway) -> dict[float, float]:
    """The histogram's cumulative buckets: upper bound -> count."""
    found: dict[float, float] = {}
    for line in gw.gateway.metrics.exposition().decode().splitlines():
        if line.startswith("slotgate_event_loop_stall_seconds_bucket"):
            bound = line.split('le="')[1].split('"')[0]
            found[float(bound)] = float(line.rsplit(" ", 1)[1])
    return found


async def test_a_blocking_callback_is_a_stall_of_its_length(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    before = stalls(gw)
    seen = asyncio.Event()
    clock = gw.gateway.stalls
    told = clock.on_stall
    assert told is not None

    def on_stall(late_s: float) -> None:
        told(late_s)
        if late_s > 0.1:
            seen.set()

    clock.on_stall = on_stall
    asyncio.get_running_loop().call_soon(time.sleep, HOLD_S)  # a callback that blocks
    async with asyncio.timeout(10):
        await seen.wait()  # the clock's next tick ran late by most of it
    after = stalls(gw)
    assert after[float("inf")] - after[0.1] >= before[float("inf")] - before[0.1] + 1
