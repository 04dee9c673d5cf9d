"""A pool's waiters' deadlines under one timer (policies/slots/deadlines.py): each waiter
expires at its own deadline, in deadline order; one that left never does; entries of
waiters gone stay bounded; a pool with no one waiting holds no timer."""

from __future__ import annotations

import asyncio

from policies.slots.deadlines import Deadlines


class Waiter:
    def __init__(self) -> None:
        self.timed = False
        self.expired: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def _expire(self) -> None:
        self.expired.set_result(asyncio.get_running_loop().time())


async def test_each_waiter_expires_at_its_deadline_in_deadline_order() -> None:
    deadlines, loop = Deadlines(), asyncio.get_running_loop()
    waits = [0.06, 0.02, 0.04, 0.02]
    began = loop.time()
    waiters = [Waiter() for _ in waits]
    for waiter, wait_s in zip(waiters, waits, strict=True):
        deadlines.add(waiter, wait_s)
    times = await asyncio.gather(*(w.expired for w in waiters))
    for at, wait_s in zip(times, waits, strict=True):
        assert at >= began + wait_s - 0.002  # (the loop's clock: a millisecond's rounding)
    assert times[1] <= times[3] <= times[2] <= times[0]
    assert not any(w.timed for w in waiters) and deadlines._timer is None


async def test_a_waiter_that_left_never_expires() -> None:
    deadlines = Deadlines()
    gone, stays = Waiter(), Waiter()
    deadlines.add(gone, 0.01)
    deadlines.add(stays, 0.03)
    deadlines.left(gone)
    await stays.expired  # past the one that left's deadline too
    assert not gone.expired.done()
    deadlines.left(stays)  # (after its expiry: nothing more to do)
    assert deadlines._heap == [] and deadlines._timer is None


async def test_no_one_waiting_leaves_no_timer_and_gone_entries_stay_bounded() -> None:
    deadlines = Deadlines()
    waiting = [Waiter() for _ in range(10)]
    for waiter in waiting:
        deadlines.add(waiter, 600)
    for _ in range(5_000):  # served at once, each: their deadlines far ahead
        passing = Waiter()
        deadlines.add(passing, 600)
        deadlines.left(passing)
        assert len(deadlines._heap) <= 2 * len(waiting) + 65
    for waiter in waiting:
        deadlines.left(waiter)
    assert deadlines._heap == [] and deadlines._timer is None
