"""A key's requests and tokens per minute (rpm, tpm), through the gateway with the official
SDK, in this process's book and in Redis; and what the limits do while Redis is away."""

from __future__ import annotations

import asyncio
import hashlib
import re
from typing import Any, cast

import openai
import pytest
import redis

from router.app import RunningGateway
from tests.support import (
    MESSAGES,
    RedisServer,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    poll_until,
    sim_backend,
)

KEY = "sk-limited-0123456789"
HOLDS = "{slotgate:limits:limited}:holds"


def config(redis_url: str | None, slots: int = 4, **limits: Any) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=slots, queue_limit=2))
    raw["auth"] = {"enabled": True, "keys": [
        {"id": "limited", "tenant": "t", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
         **limits}]}
    if redis_url is not None:
        raw["coordination"] = {"mode": "redis", "url": redis_url, "lease_ttl_s": 3,
                               "recheck_s": 0.5, "call_timeout_s": 0.2,
                               "breaker_failures": 1, "breaker_open_s": 0.5}
    return raw


async def ask(sdk: SdkClients, gw: RunningGateway, **kwargs: Any) -> Any:
    async with asyncio.timeout(10):
        return await sdk(gw, api_key=KEY).chat.completions.create(
            model="chat", messages=MESSAGES, **kwargs)


def refused_by(err: openai.APIStatusError, reason: str) -> int:
    """The refusal names `reason` in its code and header; returns its Retry-After."""
    assert err.body["code"] == reason  # type: ignore[index]
    assert err.response.headers["x-slotgate-reject-reason"] == reason
    return int(err.response.headers["retry-after"])


@pytest.fixture(params=["local", "redis"])
def redis_url(request: pytest.FixtureRequest) -> str | None:
    if request.param == "local":
        return None
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


async def test_rpm_refuses_with_the_time_until_the_bucket_refills(
        sdk: SdkClients, start: StartGateway, redis_url: str | None) -> None:
    gw = await start(config(redis_url, rpm=2))
    admitted = 0
    with pytest.raises(openai.RateLimitError) as over:
        for _ in range(4):  # 2 in the bucket (and the 3rd, if a ms refilled it above 0)
            await ask(sdk, gw)
            admitted += 1
    assert admitted in (2, 3)
    assert 1 <= refused_by(over.value, "rate_limit") <= 30  # 1 request per 30 s
    assert "2 requests per minute" in over.value.body["message"]  # type: ignore[index]
    await assert_idle(gw)


async def test_tpm_takes_the_estimate_and_refuses_below_zero(
        sdk: SdkClients, start: StartGateway, redis_url: str | None) -> None:
    gw = await start(config(redis_url, tpm=100))
    sim = engine(gw)
    sim.hold()
    running = asyncio.create_task(ask(sdk, gw, max_tokens=200))  # above 0: admitted
    await sim.wait_until(lambda e: e.active == 1)
    with pytest.raises(openai.RateLimitError) as over:  # the bucket is below -100 now
        await ask(sdk, gw, max_tokens=1)
    retry_s = refused_by(over.value, "rate_limit")
    message = over.value.body["message"]  # type: ignore[index]
    said = re.search(r"retry after (\d+) s", message)
    assert said is not None and "tpm" in message
    assert 60 < int(said.group(1)) <= 180  # back above 0 at 100 tokens a minute
    assert retry_s == 60  # the header within server.retry_after_max_s, as every one
    sim.release()
    reply = await running
    assert reply.usage.total_tokens < 100  # it used far less than its estimate
    if redis_url is None:  # what it did not use came back when it was settled
        assert await ask(sdk, gw, max_tokens=1)
    await assert_idle(gw)


async def test_fail_closed_refuses_a_limited_key_while_redis_is_away(
        sdk: SdkClients, start: StartGateway, redis_server: RedisServer) -> None:
    gw = await start(config(redis_server.url, max_concurrent=3))
    assert await ask(sdk, gw)
    await redis_server.stop()
    with pytest.raises(openai.InternalServerError) as away:
        await ask(sdk, gw)
    assert refused_by(away.value, "coordination_unavailable") >= 1
    assert "limits" in away.value.body["message"]  # type: ignore[index]
    await redis_server.start()


async def test_fail_open_local_holds_each_process_to_its_share(
        sdk: SdkClients, start: StartGateway, redis_server: RedisServer) -> None:
    raw = config(redis_server.url, slots=8, max_concurrent=4, rpm=1000)
    raw["coordination"] |= {"on_redis_down": "fail_open_local", "expected_replicas": 2}
    gw = await start(raw)
    sim = engine(gw)
    await redis_server.stop()
    sim.hold()
    running = [asyncio.create_task(ask(sdk, gw)) for _ in range(2)]  # 4 / 2 replicas
    await sim.wait_until(lambda e: e.active == 2)
    with pytest.raises(openai.RateLimitError) as capped:
        await ask(sdk, gw)
    refused_by(capped.value, "concurrency_limit")
    assert "2 requests at once" in capped.value.body["message"]  # type: ignore[index]
    sim.release()
    await asyncio.gather(*running)
    assert gw.gateway.quotas.running("limited") == 0
    await redis_server.start()


async def test_a_running_request_keeps_its_reservation_past_the_lease_ttl(
        sdk: SdkClients, start: StartGateway, redis_server: RedisServer) -> None:
    raw = config(redis_server.url, max_concurrent=1)
    # A short lease, renewed often; calls allowed a third of it, and a breaker that one slow
    # call on a loaded machine does not open (this test is about renewals, not outages).
    raw["coordination"] |= {"lease_ttl_s": 1, "recheck_s": 0.3, "call_timeout_s": 0.33,
                            "breaker_failures": 3}
    gw = await start(raw)
    sim = engine(gw)
    sim.hold()
    running = asyncio.create_task(ask(sdk, gw))
    await sim.wait_until(lambda e: e.active == 1)
    store = redis.Redis.from_url(redis_server.url)
    try:
        holds: list[tuple[bytes, float]] = cast(
            list[tuple[bytes, float]], store.zrange(HOLDS, 0, -1, withscores=True))
        [(hold, first)] = holds
        # renewed by the process's heartbeat, twice (more than a TTL on)
        await poll_until(lambda: float(store.zscore(HOLDS, hold) or 0) > first + 1000)
    finally:
        store.close()
    with pytest.raises(openai.RateLimitError) as capped:
        await ask(sdk, gw)
    refused_by(capped.value, "concurrency_limit")
    sim.release()
    await running
    await assert_idle(gw)
