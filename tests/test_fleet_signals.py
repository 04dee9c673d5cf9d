"""The desired replica count through a real gateway (#34): a line that cannot start within
its objective asks for more replicas at the next look, an idle backend for its floor; the
count is on /metrics and on GET /admin/scaling for KEDA's metrics-api scaler."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from prometheus_client import generate_latest

from router.app import RunningGateway
from router.common.config_error import ConfigError
from router.config import config_from_dict
from router.reload import apply
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    poll_until,
    sim_backend,
)


def config(**scaling: Any) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=2, queue_limit=8, initial_hold_s=2.0,
                                     scaling={"floor": 1, "ceiling": 5, "utilization": 1.0,
                                              "cooldown_s": 0, **scaling}))
    raw["fleet"] = {"refresh_s": 0.05}
    raw["slo"] = {"standard": {"ttft_s": 1.0}}
    return raw


def desired(gw: RunningGateway) -> int | None:
    fleet = gw.gateway.fleet
    assert fleet is not None
    reading = fleet.readings.get("big")
    return None if reading is None else reading.desired


async def test_a_line_that_cannot_start_in_time_asks_for_replicas(
        sdk: SdkClients, start: StartGateway, http: aiohttp.ClientSession) -> None:
    gw = await start(config())
    client, sim = sdk(gw), engine(gw)
    assert desired(gw) == 1  # the floor, from the start
    sim.hold()
    asked = [asyncio.create_task(client.chat.completions.create(model="chat",
                                                                messages=MESSAGES))
             for _ in range(6)]
    await poll_until(lambda: gw.gateway.backends["big"].pool.queued == 4)
    # 4 waiting, 2 s each, to start within 1 s: 8 slots, 4 replicas of 2
    await poll_until(lambda: desired(gw) == 4)
    async with http.get(gw.url + "/admin/scaling") as resp:
        body = await resp.json()
    assert body["backends"]["big"]["desired"] == 4
    assert body["backends"]["big"]["queued"] == 4 and body["backends"]["big"]["replicas"] == 1
    assert 'slotgate_desired_replicas{backend="big"} 4.0' in generate_latest(
        gw.gateway.metrics.registry).decode()
    sim.release()
    await asyncio.gather(*asked)
    await poll_until(lambda: desired(gw) == 1)  # idle again: the floor (no cool-down)
    await assert_idle(gw)


async def test_without_scaling_there_is_no_count(start: StartGateway,
                                                 http: aiohttp.ClientSession) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=2)))
    async with http.get(gw.url + "/admin/scaling") as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "scaling_disabled"
    async with http.get(gw.url + "/metrics") as resp:
        assert "slotgate_desired_replicas{" not in await resp.text()


async def test_a_reload_that_adds_scaling_is_counted(start: StartGateway,
                                                     http: aiohttp.ClientSession) -> None:
    raw = gateway_config(sim_backend("m", slots=2))
    gw = await start(raw)
    fleet = gw.gateway.fleet
    assert fleet is not None
    raw["backends"]["big"]["scaling"] = {"floor": 2, "ceiling": 4}
    await apply(gw.gateway, config_from_dict(raw))
    fleet.look()
    async with http.get(gw.url + "/admin/scaling") as resp:
        assert resp.status == 200
        assert (await resp.json())["backends"]["big"]["desired"] == 2  # its floor
    del raw["backends"]["big"]["scaling"]
    await apply(gw.gateway, config_from_dict(raw))
    fleet.look()
    assert fleet.readings == {}  # taken away: no count of it left
    await assert_idle(gw)


def test_a_floor_above_the_ceiling_is_refused() -> None:
    with pytest.raises(ConfigError, match="floor"):
        config_from_dict(config(floor=6))
