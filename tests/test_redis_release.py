"""A release Redis never heard (it was frozen past every retry) is expired there within the
lease's TTL; the pool's own counts follow once it has, though nobody waits on the pool to
make it poll. The answer whose slot it was does not wait for those retries."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from router.app import RunningGateway
from tests.support import (
    MESSAGES,
    RedisServer,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    sim_backend,
)


def config(redis_url: str) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=1, queue_limit=2))
    raw["coordination"] = {
        "mode": "redis", "url": redis_url, "on_redis_down": "fail_closed",
        "call_timeout_s": 0.1, "breaker_failures": 2, "breaker_open_s": 0.2,
        "lease_ttl_s": 1, "recheck_s": 0.1,
    }
    return raw


class GaveUp(logging.Handler):
    """Set when the pool says it gave a release up to Redis's TTL."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = asyncio.Event()
        self.loop = asyncio.get_running_loop()

    def emit(self, record: logging.LogRecord) -> None:
        if "Redis expires it" in record.getMessage():
            self.loop.call_soon_threadsafe(self.seen.set)


async def test_counts_follow_a_release_redis_expired(
        sdk: SdkClients, start: StartGateway, redis_server: RedisServer) -> None:
    gw: RunningGateway = await start(config(redis_server.url))
    sim = engine(gw)
    sim.hold()
    asked = asyncio.create_task(sdk(gw).chat.completions.create(model="chat",
                                                                messages=MESSAGES))
    await sim.wait_until(lambda e: e.active == 1)
    gave_up = GaveUp()
    logger = logging.getLogger("slotgate.redis")
    logger.addHandler(gave_up)
    redis_server.freeze()
    try:
        sim.release()  # the answer ends; its release cannot reach Redis
        await asked  # at once: the release's retries go on in the background
        assert not gave_up.seen.is_set()
        async with asyncio.timeout(30):
            await gave_up.seen.wait()
    finally:
        redis_server.thaw()
        logger.removeHandler(gave_up)
    await assert_idle(gw)  # within the lease's TTL and a poll, not never
