"""`queue_order: fair` through a real gateway: two tenants' keys, a simulated engine, the
official SDK as client. A light tenant's streams start among the first grants, not behind
a heavy tenant's backlog (the order read from the gateway's records: when each got its
slot, not how long anything took); a waiter moved back by a light tenant lining up
ahead of it hears its new, larger position; a reload to `fair` reorders the waiters."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml
from openai import AsyncOpenAI

from router.app import start_gateway
from router.config import load_config
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    drain_stream,
    engine,
    gateway_config,
    send_in_order,
    sim_backend,
    wait_pools,
)

KEYS = {tenant: f"sk-{tenant}-0123456789" for tenant in ("heavy", "light")}


def config(slots: int, queue_limit: int) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=slots, queue_limit=queue_limit,
                                     queue_order="fair"))
    raw["auth"] = {"enabled": True, "keys": [
        {"id": tenant, "tenant": tenant, "sha256": hashlib.sha256(key.encode()).hexdigest()}
        for tenant, key in KEYS.items()]}
    return raw


def named(prefix: str) -> Any:
    async def send(client: AsyncOpenAI, request_id: str) -> str:
        return await drain_stream(client, f"{prefix}-{request_id}")
    return send


async def test_light_streams_start_among_the_first_grants_not_behind_the_heavy(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(config(slots=2, queue_limit=60))
    sim = engine(gw)
    sim.hold()  # every generation waits before its first token until released
    heavy, light = (sdk(gw, api_key=KEYS[t]) for t in ("heavy", "light"))
    tasks, rejected = await send_in_order(heavy, gw, 40, named("heavy"))
    more, refused = await send_in_order(light, gw, 4, named("light"))
    assert rejected == refused == []
    assert gw.gateway.backends["big"].pool.queued == 38 + 4
    sim.release()
    assert all(await asyncio.gather(*tasks, *more))
    assert sim.peak == 2
    granted = sorted((r for r in gw.gateway.recent if r.slot_at),
                     key=lambda r: r.slot_at or 0)
    ids = [r.request_id for r in granted]
    assert len(ids) == 44 and ids[:2] == ["heavy-req-0", "heavy-req-1"]  # free slots
    light_at = [k for k, rid in enumerate(ids) if rid.startswith("light")]
    assert max(light_at) < 2 + 10, ids[:14]  # among the first grants from the line
    for tenant in ("heavy", "light"):  # first come, first served within a tenant
        mine = [int(rid.rsplit("-", 1)[1]) for rid in ids if rid.startswith(tenant)]
        assert mine == sorted(mine)
    assert {r.tenant for r in granted} == {"heavy", "light"}
    await assert_idle(gw)


async def statuses(resp: aiohttp.ClientResponse, until: int) -> list[int]:
    """The positions the stream hears, read until one is `until` (or a slot comes), within
    10 s (a heartbeat repeats a position every 5 s at most)."""
    heard: list[int] = []
    event = None
    async with asyncio.timeout(10):
        while not heard or heard[-1] != until:
            line = (await resp.content.readline()).rstrip(b"\r\n")
            if line.startswith(b"event:"):
                event = line[6:].strip()
            elif line.startswith(b"data:"):
                if event != b"queue_status":
                    break
                heard.append(orjson.loads(line[5:])["position"])
            elif not line and resp.content.at_eof():
                break
    return heard


async def test_a_waiter_moved_back_hears_its_larger_position(
    sdk: SdkClients, start: StartGateway
) -> None:
    gw = await start(config(slots=1, queue_limit=10))
    sim = engine(gw)
    sim.hold()
    holder = asyncio.create_task(drain_stream(sdk(gw, api_key=KEYS["heavy"]), "holder"))
    await sim.wait_until(lambda e: "holder" in e.records)
    headers = {"X-Slotgate-Queue-Events": "true"}
    body = {"model": "chat", "messages": MESSAGES, "stream": True}
    async with aiohttp.ClientSession() as http:
        waiting = []
        for n in range(1, 4):  # three of the heavy tenant's streams in line
            resp = await http.post(gw.url + "/v1/chat/completions", json=body, headers={
                **headers, "Authorization": f"Bearer {KEYS['heavy']}"})
            assert resp.status == 200
            waiting.append(resp)

            def queued(s: dict[str, tuple[int, int]], n: int = n) -> bool:
                return s["big"] == (1, n)

            await wait_pools(gw, queued)
        third = waiting[-1]
        assert await statuses(third, until=3) == [3]
        light = asyncio.create_task(drain_stream(sdk(gw, api_key=KEYS["light"]), "light"))
        await wait_pools(gw, lambda s: s["big"] == (1, 4))
        # the light tenant is served less: its stream goes second, the third heavy fourth
        assert await statuses(third, until=4) == [4]
        sim.release()
        for resp in waiting:
            await resp.read()
            resp.release()
        assert await light
    assert await holder
    granted = sorted((r for r in gw.gateway.recent if r.slot_at),
                     key=lambda r: r.slot_at or 0)
    # the holder's answer counts against the heavy tenant once it ends: light goes first
    assert [r.tenant for r in granted] == ["heavy", "light", "heavy", "heavy", "heavy"]
    await assert_idle(gw)


async def test_a_reload_to_fair_reorders_the_waiters(sdk: SdkClients, tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    raw = config(slots=1, queue_limit=10)
    raw["backends"]["big"]["queue_order"] = "fifo"
    raw["auth"]["keys"][0]["admin"] = True  # heavy's key may reload
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    gw = await start_gateway(load_config(path), "127.0.0.1", 0, config_path=str(path))
    try:
        sim = engine(gw)
        sim.hold()
        heavy, light = (sdk(gw, api_key=KEYS[t]) for t in ("heavy", "light"))
        tasks, _ = await send_in_order(heavy, gw, 3, named("heavy"))
        more, _ = await send_in_order(light, gw, 1, named("light"))
        raw["backends"]["big"]["queue_order"] = "fair"
        path.write_text(yaml.safe_dump(raw), encoding="utf-8")
        async with aiohttp.ClientSession() as http:
            async with http.post(gw.url + "/admin/reload", headers={
                    "Authorization": f"Bearer {KEYS['heavy']}"}) as resp:
                assert resp.status == 200, await resp.text()
        sim.release()
        assert all(await asyncio.gather(*tasks, *more))
        granted = sorted((r for r in gw.gateway.recent if r.slot_at),
                         key=lambda r: r.slot_at or 0)
        assert [r.request_id for r in granted] == [  # (fifo: the light one last)
            "heavy-req-0", "heavy-req-1", "light-req-0", "heavy-req-2"]
        await assert_idle(gw)
    finally:
        await gw.close()
