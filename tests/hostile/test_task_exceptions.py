"""Every task's exception is retrieved: clients that leave mid-stream from a gateway whose
slots are leased in Redis (the forwarding runs as its own task there, beside the lease's
loss) leave no "Task exception was never retrieved" behind."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import aiohttp

from router.app import RunningGateway
from tests.support import (
    MESSAGES,
    RedisServer,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    poll_until,
    sim_backend,
)


async def test_clients_that_leave_mid_stream_leave_no_unretrieved_exception(
        start: StartGateway, redis_server: RedisServer) -> None:
    raw = gateway_config(sim_backend("m", slots=4, queue_limit=8, sim={
        "tokens_per_s": 2000, "output_tokens": 400}))
    raw["coordination"] = {"mode": "redis", "url": redis_server.url}
    gw: RunningGateway = await start(raw)
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    default = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    try:
        body = {"model": "chat", "messages": MESSAGES, "stream": True, "max_tokens": 400}
        async def leave(events: int) -> None:
            async with aiohttp.ClientSession() as session:
                response = await session.post(gw.url + "/v1/chat/completions", json=body)
                for _ in range(events):  # streaming, then gone at once (no FIN first)
                    await response.content.readuntil(b"\n\n")
                response.connection.transport.abort()  # type: ignore[union-attr]
                response.release()

        for round_ in range(4):  # leaving at different points of the answer
            await asyncio.gather(*(leave(1 + i + round_) for i in range(4)))
        await poll_until(lambda: engine(gw).active == 0, within_s=10)  # engines aborted
        await assert_idle(gw)
        gc.collect()  # a finished task reports an unretrieved exception when collected
    finally:
        loop.set_exception_handler(default)
    assert not unretrieved, [c.get("message") for c in unretrieved]
