"""Redis stopped mid-load, then started again (empty): each failure mode does what it says,
no request waits forever, and the gateway recovers by itself."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import openai
import pytest
import redis.asyncio as aioredis

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
    wait_pools,
)

BOUNDED_S = 10  # every request here ends within this, whatever Redis does
HOLDERS = "{slotgate:big}:holders"


async def counted_again(gw: RunningGateway, active: int) -> None:
    """Wait, without polling, until the shared pool reports `active` leases in a reply or
    wake-up newer than any heard so far (so: from the restarted Redis)."""
    pool = gw.gateway.backends["big"].pool.shared  # type: ignore[attr-defined]
    before = pool.version
    async with asyncio.timeout(BOUNDED_S):
        while not (pool.version > before and pool.active == active):
            await pool.next_change()


def config(redis_url: str, mode: str) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=2, queue_limit=4, queue_timeout_s=30))
    raw["coordination"] = {
        "mode": "redis", "url": redis_url, "on_redis_down": mode, "call_timeout_s": 0.2,
        "breaker_failures": 2, "breaker_open_s": 0.5, "lease_ttl_s": 3, "recheck_s": 0.5,
    }
    return raw


async def ask(sdk: SdkClients, gw: RunningGateway, **kwargs: Any) -> Any:
    async with asyncio.timeout(BOUNDED_S):
        return await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES, **kwargs)


async def first_chunk(sdk: SdkClients, gw: RunningGateway) -> Any:
    stream = await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES, stream=True)
    await stream.__anext__()
    return stream


async def until_served(sdk: SdkClients, gw: RunningGateway) -> int:
    """Ask until a request is served, waiting each 503's Retry-After as a client does;
    returns how many 503s came first."""
    for refused in range(10):
        try:
            await ask(sdk, gw)
            return refused
        except openai.InternalServerError as err:
            assert err.body["code"] == "coordination_unavailable"  # type: ignore[index]
            await asyncio.sleep(float(err.response.headers["Retry-After"]))  # as told
    pytest.fail("the gateway did not recover after Redis came back")


async def test_fail_closed_refuses_while_redis_is_away_and_recovers(
    sdk: SdkClients, start: StartGateway, redis_server: RedisServer
) -> None:
    gw = await start(config(redis_server.url, "fail_closed"))
    sim = engine(gw)
    assert (await ask(sdk, gw)).choices
    sim.hold(after_tokens=1)
    streams = [await first_chunk(sdk, gw) for _ in range(2)]  # both slots, mid-answer
    waiter = asyncio.create_task(ask(sdk, gw))  # third in line
    await wait_pools(gw, lambda s: s["big"] == (2, 1))
    await redis_server.stop(kill=True)
    with pytest.raises(openai.InternalServerError) as waited:
        await waiter  # its line is gone: answered at once, not left hanging
    assert waited.value.body["code"] == "coordination_unavailable"  # type: ignore[index]
    with pytest.raises(openai.InternalServerError) as refused:
        await ask(sdk, gw)
    assert refused.value.body["code"] == "coordination_unavailable"  # type: ignore[index]
    assert "slotgate_redis_up 0.0" in gw.gateway.metrics.exposition().decode()
    assert int(refused.value.response.headers["Retry-After"]) >= 1
    assert sim.peak == 2  # nothing was let through without a slot

    await redis_server.start()  # empty: every lease and place in line is gone
    await counted_again(gw, 2)  # the running answers put their leases back
    sim.release()
    for stream in streams:  # the answers in flight kept their slots through the outage
        assert [chunk async for chunk in stream]
    await until_served(sdk, gw)
    assert "slotgate_redis_up 1.0" in gw.gateway.metrics.exposition().decode()
    await assert_idle(gw)


async def test_fail_open_local_serves_from_a_local_share_and_returns_to_redis(
    sdk: SdkClients, start: StartGateway, redis_server: RedisServer
) -> None:
    gw = await start(config(redis_server.url, "fail_open_local"))
    sim = engine(gw)
    await redis_server.stop(kill=True)
    sim.hold()
    during = [asyncio.create_task(ask(sdk, gw)) for _ in range(3)]  # 2 run, 1 waits locally
    await sim.wait_until(lambda e: e.active == 2)
    sim.release()
    assert all(reply.choices for reply in await asyncio.gather(*during))
    assert sim.peak == 2  # the local share: slots / expected_replicas (1)

    await redis_server.start()
    coordinator = gw.gateway.coordinator
    assert coordinator is not None
    async with asyncio.timeout(BOUNDED_S):  # no traffic needed: the breaker probes by itself
        await coordinator.healthy.wait()
    sim.hold()
    held = asyncio.create_task(ask(sdk, gw))
    await sim.wait_until(lambda e: e.active == 1)
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        assert await client.zcard("{slotgate:big}:holders") == 1  # shared again
    finally:
        await client.aclose()
    sim.release()
    assert (await held).choices
    await assert_idle(gw)


async def test_a_stream_whose_slot_was_given_away_ends_with_an_error(
    sdk: SdkClients, start: StartGateway, redis_server: RedisServer
) -> None:
    raw = config(redis_server.url, "fail_closed")
    raw["backends"]["big"]["slots"] = 1
    gw = await start(raw)
    engine(gw).hold(after_tokens=1)
    stream = await first_chunk(sdk, gw)
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        # As if this replica had been cut off past the TTL and another took the slot:
        [lease] = await client.zrange(HOLDERS, 0, -1)
        await client.zrem(HOLDERS, cast(bytes, lease))
        await client.zadd(HOLDERS, {"another-replica": 2**50})
        with pytest.raises(openai.APIError) as cut:
            async with asyncio.timeout(BOUNDED_S):
                async for _ in stream:
                    pass
        assert cut.value.body["code"] == "slot_lost"  # type: ignore[index]
        assert gw.gateway.recent[-1].error == "slot_lost"
        await client.zrem(HOLDERS, "another-replica")
    finally:
        await client.aclose()
    engine(gw).release()


async def test_startup_with_redis_down_follows_the_setting(
    sdk: SdkClients, start: StartGateway, redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await redis_server.stop(kill=True)
    gw = await start(config(redis_server.url, "fail_closed"))
    assert "unreachable at startup" in caplog.text and "503" in caplog.text
    with pytest.raises(openai.InternalServerError):
        await ask(sdk, gw)
    await redis_server.start()
    await until_served(sdk, gw)


async def test_the_redis_url_can_come_from_the_environment(
    sdk: SdkClients, start: StartGateway, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLOTGATE_REDIS_URL", redis_server.url)
    raw = config(redis_server.url, "fail_closed")
    raw["coordination"]["url_env"] = "SLOTGATE_REDIS_URL"
    del raw["coordination"]["url"]
    gw = await start(raw)
    assert (await ask(sdk, gw)).choices
    assert gw.gateway.coordinator is not None and gw.gateway.coordinator.healthy.is_set()
