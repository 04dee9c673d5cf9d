"""A lease's renewals and its release, against a real redis-server: a Redis call whose
caller is cancelled raises CancelledError (redis-py may finish the command and return its
reply), and a release waits for a renewal in flight, which Redis would otherwise run after
the release and so grant the slot again to nobody."""

from __future__ import annotations

import asyncio
import logging
import random

from policies.slots.redis import RedisSlotPool
from tests.support.pools import BOUND_S, PoolFactory, acquired


async def test_a_cancelled_call_raises_cancelled(redis_factory: PoolFactory) -> None:
    [pool] = await redis_factory(capacity=1, queue_limit=1)
    assert isinstance(pool, RedisSlotPool)
    coordinator = pool.coordinator
    returned = []
    for turns in range(12):  # cancelled after 0-11 turns of the loop: before, in, after I/O
        for _ in range(5):
            call = asyncio.create_task(coordinator.call("poll", pool.keys, [
                pool.ttl_ms, pool.channel, 0]))
            for _ in range(turns):
                await asyncio.sleep(0)  # one turn of the loop each
            if not call.cancel():
                continue  # done before the cancel: nothing to see
            try:
                await call
            except asyncio.CancelledError:
                continue
            returned.append(turns)
    assert not returned, f"cancelled calls returned a reply after {returned} turns"


class Lost(logging.Handler):
    """Counts the pools' 'lease ... was lost' warnings."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "was lost" in record.getMessage():
            self.seen.append(record.getMessage())


async def test_a_release_waits_for_a_renewal_in_flight(redis_factory: PoolFactory) -> None:
    # A lease of 0.06 s is renewed every 20 ms. Each of 60 leases is released at its
    # first renewal, give or take its round trip: about half of them while it is in
    # flight. The holds aim at that moment; nothing waits on them for an outcome.
    [pool] = await redis_factory(capacity=2, queue_limit=1, lease_ttl_s=0.06)
    assert isinstance(pool, RedisSlotPool)
    client = pool.coordinator.client
    lost = Lost()
    logger = logging.getLogger("slotgate.redis")
    logger.addHandler(lost)
    ghosts = 0
    try:
        for _ in range(60):
            lease = await acquired(pool)
            await asyncio.sleep(pool.lease_ttl_s / 3 + random.random() * 0.002)
            await lease.release()
            if await client.zcard(pool.keys[0]):  # granted again after its release
                ghosts += 1
                await client.delete(pool.keys[0])
        # every renewer ends with its lease (one that outlived it would renew, or grant
        # again, a slot nobody holds, for as long as the process runs)
        renewers = {t for t in asyncio.all_tasks() if t.get_name().startswith("renew-")}
        _, alive = await asyncio.wait(renewers, timeout=BOUND_S) if renewers else ((), ())
    finally:
        logger.removeHandler(lost)
    stored = await client.zcard(pool.keys[0])
    assert (ghosts, len(alive), stored, lost.seen) == (0, 0, 0, [])
