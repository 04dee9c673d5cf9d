"""A Redis blip locks no key out: Redis frozen (SIGSTOP) for a few seconds while a
`max_concurrent: 3` key's requests are being admitted. Reservations whose calls timed out
are given back as soon as Redis answers again, not when their lease expires; at the end no
slot, place in line or reservation is held."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import openai
import redis.asyncio as aioredis

from router.app import RunningGateway
from tests.support import (
    MESSAGES,
    RedisServer,
    SdkClients,
    StartGateway,
    assert_idle,
    gateway_config,
    poll_until,
    sim_backend,
)

KEY = "sk-blip"
LEASE_TTL_S = 30  # a lock-out until the lease expired would last this long
FREEZE_S = 3
AFTER_S = 3  # the key is served again within this of Redis answering: far below the TTL
HOLDS = "{slotgate:limits:k}:holds"


def config(redis_url: str) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=3, queue_limit=8, queue_timeout_s=20))
    raw["coordination"] = {
        "mode": "redis", "url": redis_url, "on_redis_down": "fail_closed",
        "call_timeout_s": 0.2, "breaker_failures": 2, "breaker_open_s": 0.5,
        "lease_ttl_s": LEASE_TTL_S, "recheck_s": 0.5,
    }
    raw["auth"] = {"enabled": True, "keys": [
        {"id": "k", "tenant": "t", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
         "max_concurrent": 3}]}
    raw["logging"] = {"access": False}
    return raw


async def load(client: openai.AsyncOpenAI, stop: asyncio.Event,
               seen: list[tuple[float, str]]) -> None:
    """Ask one after another until `stop`, noting each outcome's time and code."""
    while not stop.is_set():
        try:
            await client.chat.completions.create(model="chat", messages=MESSAGES)
            seen.append((time.monotonic(), "ok"))
        except openai.APIStatusError as err:
            body = err.body if isinstance(err.body, dict) else {}
            seen.append((time.monotonic(), str(body.get("code"))))


async def test_a_redis_blip_locks_no_key_out(
        sdk: SdkClients, start: StartGateway, redis_server: RedisServer) -> None:
    gw: RunningGateway = await start(config(redis_server.url))
    client = sdk(gw, api_key=KEY)
    coordinator, shared = gw.gateway.coordinator, gw.gateway.shared_quotas
    assert coordinator is not None and shared is not None
    stop = asyncio.Event()
    seen: list[tuple[float, str]] = []
    # three at a time on a key of three: any concurrency_limit refusal is a leaked hold
    loaders = [asyncio.create_task(load(client, stop, seen)) for _ in range(3)]
    try:
        await poll_until(lambda: len(seen) >= 30, within_s=10)  # admitted and served
        redis_server.freeze()
        try:
            await poll_until(lambda: not coordinator.healthy.is_set(), within_s=10)
            await asyncio.sleep(FREEZE_S)  # the blip's length itself, not a synchronisation
        finally:
            redis_server.thaw()
        thawed = time.monotonic()
        async with asyncio.timeout(10):
            await coordinator.healthy.wait()  # the prober heard Redis again
        await poll_until(lambda: any(at > thawed and o == "ok" for at, o in seen),
                         within_s=AFTER_S)  # served again, far below the lease TTL
        await poll_until(lambda: not shared.unknown, within_s=AFTER_S)
        mark = len(seen)
        await poll_until(lambda: len(seen) >= mark + 30, within_s=10)
    finally:
        stop.set()
        await asyncio.gather(*loaders)
    after = [o for at, o in seen if at > thawed]
    assert "concurrency_limit" not in [o for o in after[-30:]], after  # no key lock-out
    assert any(o == "coordination_unavailable" for _, o in seen)  # the blip was seen
    await assert_idle(gw)
    store = aioredis.Redis.from_url(redis_server.url)
    try:
        await poll_until(lambda: not shared.mine, within_s=5)  # settled in the background
        assert await store.zcard(HOLDS) == 0  # no reservation left behind in Redis
    finally:
        await store.aclose()
