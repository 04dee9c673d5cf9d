"""The dashboard's fleet figures (#34): each backend's replicas ready, draining and, when it
has `scaling`, desired, in the feed (`GET /dashboard/events`) and in a real headless
Chromium (Debian's, driven by Playwright). A line that cannot start in time raises the
desired count, a drain moves a replica from ready to draining, a reload listing it again
brings it back. Waits are feed events, pool states and DOM conditions, never sleeps."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from router.config import config_from_dict
from router.console.pages import pool_rows
from router.reload import apply
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    sim_backend,
    wait_pools,
)

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

    from router.app import RunningGateway

FAST = {"max_num_seqs": 4, "ttft_s": 0, "tokens_per_s": 0, "output_tokens": 8}
FIGURES = """() => Object.fromEntries([...document.querySelectorAll(
    '[data-pool] .fleet [data-figure]')].map((box) => [
        box.closest('[data-pool]').dataset.pool + '.' + box.dataset.figure,
        box.hidden ? null : box.querySelector('dd').textContent]))"""


def fleet_config() -> dict[str, Any]:
    """`big`: two replicas of one slot each, scaled, with a 2 s hold assumed and a 1 s
    objective (a line of two asks for 2 x 2 / 1 = 4 slots: 4 replicas); `small`: one
    engine, not scaled (no desired count), on no route."""
    big = {"model": "m", "endpoints": [{"simulated": FAST, "slots": 1} for _ in range(2)],
           "pick": "round_robin", "queue_limit": 8, "initial_hold_s": 2.0,
           "scaling": {"floor": 1, "ceiling": 5, "utilization": 1.0, "cooldown_s": 0}}
    return {"backends": {"big": big, "small": sim_backend("s", slots=1)},
            "routes": {"chat": {"primary": "big", "overflow": "reject"}},
            "fleet": {"refresh_s": 0.05}, "slo": {"standard": {"ttft_s": 1.0}}}


async def next_rows(resp: aiohttp.ClientResponse) -> dict[str, dict[str, Any]]:
    """The next `pools` event's rows by backend (comments skipped)."""
    data: list[bytes] = []
    async with asyncio.timeout(10):
        while True:
            line = (await resp.content.readline()).rstrip(b"\r\n")
            if line.startswith(b"data:"):
                data.append(line[5:].strip())
            elif line == b"" and data:
                return {row["name"]: row for row in orjson.loads(b"\n".join(data))}


async def big_until(resp: aiohttp.ClientResponse, wanted: dict[str, Any]) -> dict[str, Any]:
    """The first row of `big` the feed sends with every figure of `wanted`."""
    while True:
        row = (await next_rows(resp))["big"]
        if all(row.get(key) == value for key, value in wanted.items()):
            return row


async def drain(http: aiohttp.ClientSession, gw: RunningGateway, name: str) -> None:
    async with http.post(f"{gw.url}/admin/replicas/{name}/drain") as resp:
        assert resp.status == 200, await resp.text()


def a_line(gw: RunningGateway, sdk: SdkClients) -> list[asyncio.Task[Any]]:
    """Both engines held, four requests: two run (one on each replica), two wait."""
    for name in ("big-0", "big-1"):
        engine(gw, "big", name).hold()
    client = sdk(gw)
    return [asyncio.create_task(client.chat.completions.create(model="chat",
                                                               messages=MESSAGES))
            for _ in range(4)]


async def let_go(gw: RunningGateway, held: list[asyncio.Task[Any]]) -> None:
    for name in ("big-0", "big-1"):
        engine(gw, "big", name).release()
    await asyncio.gather(*held)
    await wait_pools(gw, lambda s: s["big"] == (0, 0))


async def test_the_feed_counts_ready_draining_and_desired_replicas(
        sdk: SdkClients, start: StartGateway, http: aiohttp.ClientSession) -> None:
    raw = fleet_config()
    gw = await start(raw)
    async with http.get(gw.url + "/dashboard/events") as events:
        rows = await next_rows(events)
        assert {k: rows["big"][k] for k in ("ready", "draining", "desired")} == {
            "ready": 2, "draining": 0, "desired": 1}  # the floor, from the start
        assert rows["small"]["ready"] == 1 and rows["small"]["draining"] == 0
        assert "desired" not in rows["small"]  # no scaling: no count
        held = a_line(gw, sdk)
        # two waiting 2 s each, to start within 1 s: 4 slots, 4 replicas of one
        row = await big_until(events, {"desired": 4})
        assert row["queued"] == 2 and row["ready"] == 2 and row["draining"] == 0
        await drain(http, gw, "big-0")  # it holds one request: it runs it out
        row = await big_until(events, {"ready": 1})
        assert row["draining"] == 1
        assert sorted((r["name"], r["slots"], r["active"]) for r in row["replicas"]) == [
            ("big-0", 0, 1), ("big-1", 1, 1)]  # big-0: no slot of the pool, one request
        await let_go(gw, held)
        # drained and holding nothing: still out of service until a reload lists it
        row = await big_until(events, {"active": 0, "queued": 0})
        assert row["ready"] == 1 and row["draining"] == 1
        await apply(gw.gateway, config_from_dict(raw))
        row = await big_until(events, {"ready": 2})
        assert row["draining"] == 0
    await assert_idle(gw)


async def test_a_replica_removed_by_a_reload_drains_while_it_holds(
        sdk: SdkClients, start: StartGateway) -> None:
    raw = fleet_config()
    gw = await start(raw)
    held = a_line(gw, sdk)
    await wait_pools(gw, lambda s: s["big"] == (2, 2))
    fewer = orjson.loads(orjson.dumps(raw))
    fewer["backends"]["big"]["endpoints"] = fewer["backends"]["big"]["endpoints"][1:]
    fewer["backends"]["big"]["endpoints"][0]["name"] = "big-1"
    await apply(gw.gateway, config_from_dict(fewer))
    (row, _) = pool_rows(gw.gateway)
    assert (row["ready"], row["draining"]) == (1, 1)  # big-0 runs out its request
    await let_go(gw, held)
    (row, _) = pool_rows(gw.gateway)
    assert (row["ready"], row["draining"]) == (1, 0)  # gone: removed, not drained
    await assert_idle(gw)


async def shows(dash: Page, figures: dict[str, str | None]) -> None:
    """Until the cards show these figures (None: the figure is hidden)."""
    await dash.wait_for_function(
        f"(want) => {{ const got = ({FIGURES})(); "
        "return Object.entries(want).every(([k, v]) => got[k] === v); }", arg=figures)


async def test_the_dashboard_shows_ready_draining_and_desired(
        sdk: SdkClients, start: StartGateway, browser: Browser,
        http: aiohttp.ClientSession) -> None:
    raw = fleet_config()
    gw = await start(raw)
    dash = await browser.new_page(viewport={"width": 1000, "height": 800})
    errors: list[str] = []
    dash.on("pageerror", lambda exc: errors.append(str(exc)))
    dash.set_default_timeout(10_000)
    await dash.goto(gw.url + "/dashboard")
    await shows(dash, {"big.ready": "2", "big.draining": "0", "big.desired": "1",
                       "small.ready": "1", "small.draining": "0", "small.desired": None})
    held = a_line(gw, sdk)
    await shows(dash, {"big.desired": "4"})
    assert await dash.locator("#pool-0-desired.hot").count() == 1  # wants more than it has
    await drain(http, gw, "big-0")
    await shows(dash, {"big.ready": "1", "big.draining": "1"})
    await let_go(gw, held)
    await shows(dash, {"big.desired": "1", "big.ready": "1", "big.draining": "1"})
    await apply(gw.gateway, config_from_dict(raw))
    await shows(dash, {"big.ready": "2", "big.draining": "0", "big.desired": "1"})
    assert await dash.locator("#pool-0-desired.hot").count() == 0
    assert errors == []
    await dash.close()
    await assert_idle(gw)
