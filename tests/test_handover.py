"""MoveOffers: a freed fallback slot goes to the oldest offer, after the pool's own queue."""

from __future__ import annotations

from policies.clock.holds import HoldTimeModel
from policies.slots import LocalSlotPool
from policies.slots.handover import MoveOffers


def pool(capacity: int = 1, queue_limit: int = 4) -> LocalSlotPool:
    return LocalSlotPool("small", capacity, queue_limit, HoldTimeModel(1.0))


async def test_offer_granted_at_once_when_a_slot_is_free() -> None:
    small = pool()
    offers = MoveOffers(small)
    offer = offers.offer()
    assert offer.done() and small.active == 1
    await offer.result().release()
    assert small.active == 0


async def test_freed_slot_goes_to_the_oldest_offer() -> None:
    small = pool()
    offers = MoveOffers(small)
    busy = small.acquire_nowait()
    assert busy is not None
    first, second = offers.offer(), offers.offer()
    assert not first.done()
    await busy.release()
    assert first.done() and not second.done()
    assert small.active == 1
    await first.result().release()
    assert second.done()
    await second.result().release()
    assert (small.active, len(offers)) == (0, 0)


async def test_the_pools_own_waiters_come_first() -> None:
    small = pool()
    offers = MoveOffers(small)
    busy = small.acquire_nowait()
    assert busy is not None
    ticket = small.enqueue_nowait()
    assert ticket is not None
    offer = offers.offer()
    await busy.release()  # handed to the ticket, not to the offer
    assert not offer.done()
    own = await ticket.wait(1)
    await own.release()
    assert offer.done()
    offers.withdraw(offer)  # granted but never taken: the slot goes back
    assert small.active == 0


async def test_withdrawn_offer_is_skipped() -> None:
    small = pool()
    offers = MoveOffers(small)
    busy = small.acquire_nowait()
    assert busy is not None
    gone, kept = offers.offer(), offers.offer()
    offers.withdraw(gone)
    await busy.release()
    assert gone.cancelled() and kept.done()
    await kept.result().release()
    assert small.active == 0
