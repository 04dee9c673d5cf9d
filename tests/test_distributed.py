"""Several gateway processes sharing one backend's slots through a real redis-server.

The backend is a simulated engine in this process (so its peak concurrency can be read),
or a group of them; the gateways are `slotgate serve` processes, as an operator runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import redis.asyncio as aioredis
import yaml

from policies.config import SimulatedSpec
from router.upstream.simulated.app import RunningSim, start_simulator
from tests.support import MESSAGES, GatewayProcess, RedisServer

WAITERS_KEY = "{slotgate:big}:waiters"
HOLDERS_KEY = "{slotgate:big}:holders"


def write_config(folder: Path, sim: RunningSim, redis_url: str, **coordination: Any) -> Path:
    big = {"url": sim.url + "/v1", "model": "m", "slots": 3, "queue_limit": 9,
           "queue_timeout_s": 60}
    return write_raw(folder, big, redis_url, **coordination)


def write_raw(folder: Path, big: dict[str, Any], redis_url: str, **coordination: Any) -> Path:
    raw = {
        "backends": {"big": big},
        "routes": {"chat": {"primary": "big", "overflow": "reject"}},
        "coordination": {"mode": "redis", "url": redis_url, **coordination},
        "logging": {"access": False},
    }
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path



@contextlib.asynccontextmanager
async def line_joins(redis_url: str, key: str = WAITERS_KEY,
                     event: bytes | None = b"zadd") -> AsyncIterator[asyncio.Queue[object]]:
    """One item per ticket that joins the shared line (Redis keyspace notifications); or
    per `event` (None: any) on `key`."""
    client = aioredis.Redis.from_url(redis_url)
    await client.config_set("notify-keyspace-events", "Kgz")
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(f"__keyspace@0__:{key}")
    joins: asyncio.Queue[object] = asyncio.Queue()

    async def listen() -> None:
        async for message in pubsub.listen():
            if event is None or message["data"] == event:
                joins.put_nowait(message)

    task = asyncio.create_task(listen())
    try:
        yield joins
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await pubsub.aclose()  # type: ignore[no-untyped-call,unused-ignore]
        await client.aclose()


async def test_three_replicas_keep_three_slots_and_one_line(
    tmp_path: Path, redis_server: RedisServer, engine_sim: RunningSim
) -> None:
    sim = engine_sim.engine
    sim.hold()  # nothing finishes unless its client leaves
    config = write_config(tmp_path, engine_sim, redis_server.url)
    gateways = [await GatewayProcess.start(config) for _ in range(3)]
    clients = [g.client() for g in gateways]

    def ask(i: int, request_id: str) -> asyncio.Task[Any]:
        return asyncio.create_task(clients[i % 3].chat.completions.create(
            model="chat", messages=MESSAGES, extra_headers={"X-Request-Id": request_id}))

    try:
        running = [ask(i, f"h{i}") for i in range(3)]
        await sim.wait_until(lambda e: e.active == 3)
        queued = []
        async with line_joins(redis_server.url) as joins:
            for i in range(9):  # one at a time, round robin: the arrival order is known
                queued.append(ask(i, f"q{i}"))
                async with asyncio.timeout(10):
                    await joins.get()
        # 10x the slots in all: the line is full, so every further request is a 429
        extra = await asyncio.gather(*(ask(i, f"x{i}") for i in range(18)),
                                     return_exceptions=True)
        assert all(isinstance(r, openai.RateLimitError) for r in extra), extra
        assert not any(r.startswith("x") for r in sim.records)
        # Free one slot at a time (the oldest client leaves): the next in line starts,
        # whichever replica it arrived at.
        started: list[str] = []
        for i in range(9):
            running.pop(0).cancel()
            await sim.wait_until(lambda e: len([r for r in e.records if r[0] == "q"])
                                 > len(started))
            new = [r for r in sim.records if r[0] == "q" and r not in started]
            assert new == [f"q{i}"], (new, started)
            started.append(new[0])
            running.append(queued[i])
        assert sim.peak == 3  # never more than the slots, across three processes
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    finally:
        codes = [await g.stop() for g in gateways]
    assert codes == [0, 0, 0]
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        assert await client.zcard("{slotgate:big}:holders") == 0  # all released on the way out
    finally:
        await client.aclose()


async def test_a_killed_replicas_slots_return_within_the_lease_ttl(
    tmp_path: Path, redis_server: RedisServer, engine_sim: RunningSim
) -> None:
    ttl, recheck = 3.0, 0.5
    sim = engine_sim.engine
    sim.hold()
    config = write_config(tmp_path, engine_sim, redis_server.url, lease_ttl_s=ttl,
                          recheck_s=recheck)
    doomed, survivor = await GatewayProcess.start(config), await GatewayProcess.start(config)
    try:
        holders = [asyncio.create_task(doomed.client().chat.completions.create(
            model="chat", messages=MESSAGES)) for _ in range(3)]
        await sim.wait_until(lambda e: e.active == 3)
        async with line_joins(redis_server.url) as joins:
            waiter = asyncio.create_task(survivor.client().chat.completions.create(
                model="chat", messages=MESSAGES, extra_headers={"X-Request-Id": "waiter"}))
            async with asyncio.timeout(10):
                await joins.get()
        loop = asyncio.get_running_loop()
        await doomed.stop(signal.SIGKILL)  # no release, no goodbye: only the TTL frees them
        killed_at = loop.time()
        await sim.wait_until(lambda e: "waiter" in e.records, timeout=ttl * 4)
        returned_s = loop.time() - killed_at
        # the documented bound: TTL + renew interval + 1 s
        assert returned_s <= ttl + ttl / 3 + 1.0, returned_s
        sim.release()
        assert (await waiter).choices
        await asyncio.gather(*holders, return_exceptions=True)
    finally:
        await survivor.stop()
        await doomed.stop(signal.SIGKILL)


async def test_three_processes_keep_each_engine_of_a_group_within_its_slots(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Three gateway processes, one backend of three engines of 2 slots each (shared
    engines: each process sends to the same three), 20 streams at once."""
    spec = SimulatedSpec(max_num_seqs=256, ttft_s=0, tokens_per_s=0, output_tokens=4)
    running = [await start_simulator(spec, "m") for _ in range(3)]
    engines = [r.engine for r in running]
    big = {"model": "m", "queue_limit": 20, "queue_timeout_s": 60,
           "endpoints": [{"url": r.url + "/v1", "slots": 2} for r in running]}
    config = write_raw(tmp_path, big, redis_server.url)
    gateways = [await GatewayProcess.start(config) for _ in range(3)]
    redis = aioredis.Redis.from_url(redis_server.url)
    tasks: list[asyncio.Task[str]] = []

    async def stream(i: int) -> str:
        chunks = await gateways[i % 3].client().chat.completions.create(
            model="chat", messages=MESSAGES, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in chunks
                        if c.choices])

    try:
        for sim in engines:
            sim.hold()
        async with line_joins(redis_server.url) as joins:
            tasks += [asyncio.create_task(stream(i)) for i in range(20)]
            for sim in engines:
                await sim.wait_until(lambda e: e.active == 2)  # all six slots used
            async with asyncio.timeout(10):
                while await redis.zcard(WAITERS_KEY) < 14:  # the rest wait in one line
                    await joins.get()
        assert await redis.hgetall("{slotgate:big}:seats") == {
            f"big-{i}".encode(): b"2" for i in range(3)}
        async with line_joins(redis_server.url, HOLDERS_KEY, None) as changes:
            for sim in engines:
                sim.release()
            assert all(await asyncio.gather(*tasks))  # everything served
            async with asyncio.timeout(10):
                while await redis.zcard(HOLDERS_KEY):  # idle after
                    await changes.get()
        assert [sim.peak for sim in engines] == [2, 2, 2]  # no engine ever above 2
        assert sum(len(sim.records) for sim in engines) == 20
        assert await redis.zcard(WAITERS_KEY) == 0
        assert await redis.hlen("{slotgate:big}:seats") == 0
        assert await redis.hlen("{slotgate:big}:placed") == 0
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        codes = [await g.stop() for g in gateways]
        await redis.aclose()
        for sim_running in running:
            await sim_running.close()
    assert codes == [0, 0, 0]
