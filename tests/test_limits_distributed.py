"""One key's limits held across three gateway processes sharing a real redis-server: its
concurrency cap, its token budget under concurrent load, and the reservations of a
process killed outright coming back within the lease TTL.

The backend is a simulated engine in this process (its peak concurrency is read there);
the gateways are `slotgate serve` processes. Their SDK clients use the key "sk-test".
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis
import yaml

from router.upstream.simulated.app import RunningSim
from tests.support import MESSAGES, GatewayProcess, RedisServer, poll_until

HOLDS = "{slotgate:limits:k}:holds"


def write_config(folder: Path, sim: RunningSim, redis_url: str, **limits: Any) -> Path:
    raw = {
        "backends": {"big": {"url": sim.url + "/v1", "model": "m", "slots": 64,
                             "queue_limit": 64}},
        "routes": {"chat": {"primary": "big", "overflow": "reject"}},
        "coordination": {"mode": "redis", "url": redis_url, "lease_ttl_s": 1.5,
                         "recheck_s": 0.5},
        "auth": {"enabled": True, "keys": [
            {"id": "k", "tenant": "t", "sha256": hashlib.sha256(b"sk-test").hexdigest(),
             **limits}]},
        "logging": {"access": False},
    }
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path



@pytest.fixture
async def gateways(tmp_path: Path) -> AsyncIterator[list[GatewayProcess]]:
    """The gateway processes a test started (append), stopped at its end."""
    started: list[GatewayProcess] = []
    try:
        yield started
    finally:
        for gateway in started:
            await gateway.stop()


async def start_three(gateways: list[GatewayProcess], config: Path) -> list[openai.AsyncOpenAI]:
    for _ in range(3):
        gateways.append(await GatewayProcess.start(config))
    return [g.client() for g in gateways]


def no_live_holds(redis_url: str) -> bool:
    """No reservation of the key is live by Redis's clock (expired ones may remain until
    the next script purges them)."""
    client = redis.Redis.from_url(redis_url)
    try:
        seconds, micros = client.time()
        return client.zcount(HOLDS, f"({int(seconds) * 1000 + int(micros) // 1000}",
                             "+inf") == 0
    finally:
        client.close()


async def settled(tasks: list[asyncio.Task[Any]], n: int) -> None:
    """Wait until `n` of `tasks` have ended."""
    async with asyncio.timeout(30):
        while sum(t.done() for t in tasks) < n:
            await asyncio.wait([t for t in tasks if not t.done()],
                               return_when=asyncio.FIRST_COMPLETED)


def refused_by(results: list[Any], reason: str) -> int:
    """How many of `results` are 429s naming `reason`; none is another error."""
    errors = [r for r in results if isinstance(r, BaseException)]
    refused = [e for e in errors if isinstance(e, openai.RateLimitError)]
    assert refused == errors, errors
    codes = [e.response.headers["x-slotgate-reject-reason"] for e in refused]
    assert set(codes) <= {reason}, codes
    return len(codes)


async def test_max_concurrent_holds_across_three_processes(
        tmp_path: Path, redis_server: RedisServer, engine_sim: RunningSim,
        gateways: list[GatewayProcess]) -> None:
    sim = engine_sim.engine
    clients = await start_three(gateways, write_config(tmp_path, engine_sim,
                                                       redis_server.url, max_concurrent=5))

    def ask(i: int) -> asyncio.Task[Any]:
        return asyncio.create_task(
            clients[i % 3].chat.completions.create(model="chat", messages=MESSAGES))

    for _ in range(2):  # twice: the first burst's reservations all came back
        sim.hold()
        burst = [ask(i) for i in range(15)]
        await settled(burst, 10)  # 10 refused at once; 5 run, held
        await sim.wait_until(lambda e: e.active == 5)
        refusals = [t.exception() for t in burst if t.done()]
        assert refused_by(refusals, "concurrency_limit") == 10
        sim.release()
        assert refused_by(await asyncio.gather(*burst, return_exceptions=True),
                          "concurrency_limit") == 10
        await poll_until(lambda: no_live_holds(redis_server.url))  # settled in the background
    assert sim.peak == 5  # never more at once, whichever process they came through


async def test_a_token_budget_is_overspent_by_at_most_one_request(
        tmp_path: Path, redis_server: RedisServer, engine_sim: RunningSim,
        gateways: list[GatewayProcess]) -> None:
    limit = 300
    clients = await start_three(gateways, write_config(
        tmp_path, engine_sim, redis_server.url,
        budgets=[{"period": "month", "tokens": limit}]))
    used: list[int] = []
    for _ in range(30):  # waves of concurrent requests through all three, until refused
        wave = await asyncio.gather(*(
            clients[i % 3].chat.completions.create(model="chat", messages=MESSAGES,
                                                   max_tokens=8)
            for i in range(9)), return_exceptions=True)
        used += [r.usage.total_tokens for r in wave
                 if not isinstance(r, BaseException) and r.usage is not None]
        if refused_by(wave, "budget_exceeded") == len(wave):
            break
        await poll_until(lambda: no_live_holds(redis_server.url))  # the wave settled
    else:
        pytest.fail("the budget never refused")
    assert limit <= sum(used) <= limit + max(used)


async def test_a_killed_process_gives_its_reservations_back_within_the_lease(
        tmp_path: Path, redis_server: RedisServer, engine_sim: RunningSim,
        gateways: list[GatewayProcess]) -> None:
    sim = engine_sim.engine
    sim.hold()
    clients = await start_three(gateways, write_config(tmp_path, engine_sim,
                                                       redis_server.url, max_concurrent=2))
    held = [asyncio.create_task(clients[0].chat.completions.create(
        model="chat", messages=MESSAGES)) for _ in range(2)]
    await sim.wait_until(lambda e: e.active == 2)
    with pytest.raises(openai.RateLimitError):
        await clients[1].chat.completions.create(model="chat", messages=MESSAGES)
    await gateways[0].stop(signal.SIGKILL)  # no settle: only the lease's expiry frees them
    await asyncio.gather(*held, return_exceptions=True)
    await poll_until(lambda: no_live_holds(redis_server.url), within_s=10)
    sim.release()
    replies = await asyncio.gather(*(c.chat.completions.create(model="chat",
                                                               messages=MESSAGES)
                                     for c in clients[1:]))
    assert all(r.choices for r in replies)
