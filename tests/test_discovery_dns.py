"""A group found in DNS (#34), against a DNS server on loopback whose records the test
changes under load: a replica added is health-checked, then serves; one removed takes no
new request and finishes those it runs; no request is lost and no engine ever runs more
than its slots, with one gateway and with two sharing Redis. A failed lookup keeps the
replicas found before."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from policies.config import SimulatedSpec
from router.app import RunningGateway
from router.upstream.simulated.app import RunningSim, start_simulator
from tests.support import (
    MESSAGES,
    RedisServer,
    SdkClients,
    StartGateway,
    assert_idle,
    poll_until,
)
from tests.support.dns_zone import Zone, serving

SLOTS = 2
SPEC = SimulatedSpec(max_num_seqs=SLOTS, ttft_s=0.01, tokens_per_s=400, output_tokens=6)
NAME = "llm.inference.test"


@pytest.fixture
async def zone() -> AsyncIterator[Zone]:
    with serving(Zone()) as served:
        yield served


async def engines_on_one_port(*hosts: str) -> list[RunningSim]:
    """A simulated engine on each loopback address, all at the same port (as the pods of
    a headless Service are)."""
    first = await start_simulator(SPEC, "m", hosts[0], 0)
    port = int(first.url.rsplit(":", 1)[1])
    return [first, *[await start_simulator(SPEC, "m", host, port) for host in hosts[1:]]]


def discovered(zone: Zone, port: int, **more: Any) -> dict[str, Any]:
    discover = {"dns": NAME, "port": port, "nameservers": [zone.nameserver], "slots": SLOTS,
                "refresh_s": 0.05, "check_s": 0.05, **more}
    return {"backends": {"big": {"model": "m", "discover": discover, "queue_limit": 64,
                                 "pick": "least_loaded"}},
            "routes": {"chat": {"primary": "big", "overflow": "reject"}}}


def ready(gw: RunningGateway) -> set[str]:
    return {s.name for s in gw.gateway.backends["big"].pool.seats() if s.healthy and s.slots}


async def load(clients: list[openai.AsyncOpenAI], stop: asyncio.Event,
               answers: list[str]) -> None:
    """Streams, one after another, until `stop`; every answer kept (an error raises)."""
    turn = 0
    while not stop.is_set():
        client = clients[turn % len(clients)]
        turn += 1
        chunks = await client.chat.completions.create(model="chat", messages=MESSAGES,
                                                      stream=True)
        answers.append("".join([c.choices[0].delta.content or "" async for c in chunks
                                if c.choices]))


@contextlib.asynccontextmanager
async def under_load(clients: list[openai.AsyncOpenAI], workers: int
                     ) -> AsyncIterator[list[str]]:
    stop, answers = asyncio.Event(), list[str]()
    tasks = [asyncio.create_task(load(clients, stop, answers)) for _ in range(workers)]
    try:
        yield answers
    finally:
        stop.set()
        await asyncio.gather(*tasks)  # any lost request raises here


async def all_ready(gateways: list[RunningGateway], names: set[str]) -> None:
    for gw in gateways:
        await poll_until(functools.partial(lambda gw: ready(gw) == names, gw))


async def served_by(sim: RunningSim, more_than: int) -> None:
    await sim.engine.wait_until(lambda e: len(e.records) > more_than)


async def change_under_load(zone: Zone, sims: list[RunningSim], gateways: list[RunningGateway],
                            clients: list[openai.AsyncOpenAI]) -> list[str]:
    """Serve from .2, add .3, remove .2, all while 6 streams run at once."""
    first, second = sims
    async with under_load(clients, 6) as answers:
        await served_by(first, 5)
        zone.set_a(NAME, "127.0.0.2", "127.0.0.3")
        await all_ready(gateways, {"127.0.0.2", "127.0.0.3"})
        await served_by(second, 5)
        zone.set_a(NAME, "127.0.0.3")
        await all_ready(gateways, {"127.0.0.3"})
        await first.engine.wait_until(lambda e: e.active == 0)
        done = len(second.engine.records)
        await served_by(second, done + 5)
    assert len(first.engine.records) > 5 and first.engine.active == 0
    return answers


async def test_replicas_added_and_removed_under_load(
        zone: Zone, start: StartGateway, sdk: SdkClients) -> None:
    sims = await engines_on_one_port("127.0.0.2", "127.0.0.3")
    try:
        port = int(sims[0].url.rsplit(":", 1)[1])
        zone.set_a(NAME, "127.0.0.2")
        gw = await start(discovered(zone, port))
        await poll_until(lambda: ready(gw) == {"127.0.0.2"})
        answers = await change_under_load(zone, sims, [gw], [sdk(gw)])
        assert answers and all(len(a.split()) == 6 for a in answers)  # none cut, none lost
        assert all(sim.engine.peak <= SLOTS for sim in sims)  # never over-admitted
        removed = gw.gateway.backends["big"].replicas["127.0.0.2"]
        assert removed.retired
        await assert_idle(gw)
    finally:
        for sim in sims:
            await sim.close()


async def test_two_gateways_sharing_redis_keep_the_slots_exact(
        zone: Zone, start: StartGateway, sdk: SdkClients, redis_server: RedisServer) -> None:
    """Each gateway finds and checks the replicas on its own; the slots of each are
    counted in Redis by its name, so together they never run more than its slots."""
    sims = await engines_on_one_port("127.0.0.2", "127.0.0.3")
    try:
        port = int(sims[0].url.rsplit(":", 1)[1])
        zone.set_a(NAME, "127.0.0.2")
        raw = {**discovered(zone, port),
               "coordination": {"mode": "redis", "url": redis_server.url}}
        gateways = [await start(raw), await start(raw)]
        await all_ready(gateways, {"127.0.0.2"})
        answers = await change_under_load(zone, sims, gateways, [sdk(gw) for gw in gateways])
        assert answers and all(len(a.split()) == 6 for a in answers)
        assert all(sim.engine.peak <= SLOTS for sim in sims)  # exact across both gateways
        for gw in gateways:
            await assert_idle(gw)
    finally:
        for sim in sims:
            await sim.close()


async def test_a_failed_lookup_keeps_the_replicas_found(
        zone: Zone, start: StartGateway, sdk: SdkClients) -> None:
    sims = await engines_on_one_port("127.0.0.2")
    try:
        zone.set_a(NAME, "127.0.0.2")
        gw = await start(discovered(zone, int(sims[0].url.rsplit(":", 1)[1])))
        await poll_until(lambda: ready(gw) == {"127.0.0.2"})
        zone.failing = True
        await zone.next_questions(3)  # SERVFAIL, look after look
        assert ready(gw) == {"127.0.0.2"}
        reply = await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)
        assert reply.choices[0].message.content
        zone.failing = False
        zone.set_a(NAME)  # no address: NXDOMAIN, a group of none
        await poll_until(lambda: not ready(gw))
        assert gw.gateway.backends["big"].replicas["127.0.0.2"].retired
        await assert_idle(gw)
    finally:
        await sims[0].close()
