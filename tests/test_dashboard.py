"""The web pages and the dashboard's live feed, against a real gateway on loopback."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import aiohttp
import orjson
import pytest
from yarl import URL

from router.app import start_gateway
from router.config import config_from_dict
from router.console.pages import PAGES, pool_rows
from tests.support import StartGateway, assert_idle, engine, gateway_config, sim_backend

CHAT = {"model": "chat", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


async def next_event(resp: aiohttp.ClientResponse, within_s: float = 5.0) -> tuple[str, Any]:
    """The next named SSE event (name, decoded JSON data); comments are skipped."""
    name, data = "message", list[str]()
    async with asyncio.timeout(within_s):
        while True:
            raw = await resp.content.readline()
            assert raw, "the stream ended"
            line = raw.decode().rstrip("\r\n")
            if line == "":
                if data:
                    return name, orjson.loads("\n".join(data))
                name = "message"
            elif line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())


async def pools_until(resp: aiohttp.ClientResponse, pool: str, predicate: Any) -> dict[str, Any]:
    while True:
        name, rows = await next_event(resp)
        assert name == "pools"
        row = next(r for r in rows if r["name"] == pool)
        if predicate(row):
            return dict(row)


async def test_pages_are_served_as_html(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("big-70b", slots=3, queue_limit=5)))
    async with aiohttp.ClientSession() as http:
        for path, marker in (("/", 'id="queue"'), ("/dashboard", 'id="pools"')):
            async with http.get(gw.url + path) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"] == "text/html; charset=utf-8"
                assert resp.headers["Cache-Control"] == "no-cache"
                assert "default-src 'self'" in resp.headers["Content-Security-Policy"]
                assert marker in await resp.text()
        for name, kind in (("app.js", "text/javascript"), ("sse.js", "text/javascript"),
                           ("dashboard.js", "text/javascript"), ("style.css", "text/css")):
            async with http.get(f"{gw.url}/static/{name}") as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"] == f"{kind}; charset=utf-8"
                assert resp.headers["Cache-Control"] == "no-cache"
    await assert_idle(gw)


@pytest.mark.parametrize("path", [
    "/static/..%2Fpages.py",
    "/static/%2e%2e%2fpages.py",
    "/static/%2E%2E/pages.py",
    "/static/../pages.py",
    "/static/..",
    "/static/.",
    "/static/nothing.js",
    "/static/%2Fetc%2Fpasswd",
])
async def test_static_files_only_from_the_web_folder(start: StartGateway, path: str) -> None:
    gw = await start(gateway_config(sim_backend("big-70b", slots=1)))
    async with aiohttp.ClientSession() as http:
        # encoded=True: the path reaches the server exactly as written, ".." included
        async with http.get(URL(gw.url + path, encoded=True)) as resp:
            body = await resp.text()
            assert resp.status == 404
            assert "def setup" not in body and "import" not in body
            assert resp.headers["Content-Type"].startswith("application/json")
    await assert_idle(gw)


async def test_events_follow_the_pool_and_unsubscribe_on_disconnect(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("big-70b", slots=3, queue_limit=5)))
    pages = gw.app[PAGES]
    pool = gw.gateway.backends["big"].pool
    watchers_before = len(pool._watchers)  # type: ignore[attr-defined]
    sim = engine(gw)
    sim.hold()
    async with aiohttp.ClientSession() as http:
        async with http.get(gw.url + "/dashboard/events") as events:
            assert events.status == 200
            assert events.headers["Content-Type"].startswith("text/event-stream")
            name, rows = await next_event(events, within_s=2.0)  # sent at once
            assert name == "pools"
            (row,) = rows
            assert row["capacity"] == 3 and row["active"] == 0 and row["queued"] == 0
            assert row["queue_limit"] == 5 and row["eta_s"] == 0.0
            assert row["replicas"] == [{"name": "big", "slots": 3, "active": 0,
                                        "healthy": True}]  # a group of one
            assert len(pool._watchers) == watchers_before + 1  # type: ignore[attr-defined]

            busy = asyncio.create_task(http.post(gw.url + "/v1/chat/completions", json=CHAT))
            row = await pools_until(events, "big", lambda r: r["active"] == 1)
            assert row["queued"] == 0 and row["replicas"][0]["active"] == 1

        await pages.wait_subscribers(0)  # the feed saw the disconnect and left
        assert len(pool._watchers) == watchers_before  # type: ignore[attr-defined]
        sim.release()
        async with await busy as resp:
            assert resp.status == 200
            assert "[DONE]" in await resp.text()
    await assert_idle(gw)


async def test_bursts_are_coalesced_and_full_pools_show_an_eta(start: StartGateway) -> None:
    # A held engine that would answer at once: its nominal first-token time (a hint) gives
    # the forecast something to show.
    gw = await start(gateway_config(sim_backend("big-70b", slots=2, queue_limit=4,
                                                rates={"ttft_s": 1.0})))
    sim = engine(gw)
    sim.hold()
    async with aiohttp.ClientSession() as http:
        async with http.get(gw.url + "/dashboard/events") as events:
            await next_event(events)
            loop = asyncio.get_running_loop()
            changes = [0]

            def count(_: object) -> None:
                changes[0] += 1

            unwatch = gw.gateway.backends["big"].pool.watch(count)
            sent = [asyncio.create_task(http.post(gw.url + "/v1/chat/completions", json=CHAT))
                    for _ in range(5)]
            stamps: list[float] = []
            while True:
                _, rows = await next_event(events)
                stamps.append(loop.time())
                (row,) = rows
                if row["queued"] == 3:
                    break
            assert row["active"] == 2
            # the first of two fresh leases frees within one mean holding time
            assert 0 < row["eta_s"] <= row["mean_hold_s"]
            # five requests made at least ten pool changes: the feed sent spaced events
            gaps = [b - a for a, b in itertools.pairwise(stamps)]
            assert all(gap > 0.1 for gap in gaps), gaps
            assert changes[0] == 5 and len(stamps) < 5, (changes, stamps)
        unwatch()
        sim.release()
        for task in sent:
            async with await task as resp:
                assert resp.status == 200
                await resp.read()
    await assert_idle(gw)


async def test_subscribers_are_bounded(start: StartGateway) -> None:
    gw = await start(gateway_config(sim_backend("big-70b", slots=1)))
    pages = gw.app[PAGES]
    pages.max_subscribers = 2
    async with aiohttp.ClientSession() as http:
        first = await http.get(gw.url + "/dashboard/events")
        second = await http.get(gw.url + "/dashboard/events")
        await next_event(first)
        await next_event(second)
        async with http.get(gw.url + "/dashboard/events") as third:
            assert third.status == 503
            assert third.headers["Retry-After"] == "10"
            body = await third.json()
            assert body["error"]["code"] == "too_many_subscribers"
        first.close()
        await pages.wait_subscribers(1)
        async with http.get(gw.url + "/dashboard/events") as again:
            assert again.status == 200
            await next_event(again)
        second.close()
    await pages.wait_subscribers(0)
    await assert_idle(gw)


async def test_rejections_and_fallbacks_are_counted_for_the_last_minute(
    start: StartGateway,
) -> None:
    gw = await start(gateway_config(sim_backend("big-70b", slots=1),
                                    sim_backend("small-8b", slots=1), overflow="fallback"))
    sim_big, sim_small = engine(gw, "big"), engine(gw, "small")
    sim_big.hold()
    sim_small.hold()
    async with aiohttp.ClientSession() as http:
        url = gw.url + "/v1/chat/completions"
        first = asyncio.create_task(http.post(url, json=CHAT))
        await sim_big.wait_until(lambda e: e.active == 1)
        overflowed = asyncio.create_task(http.post(url, json=CHAT))  # to the fallback
        await sim_small.wait_until(lambda e: e.active == 1)
        async with http.post(url, json=CHAT) as rejected:  # both full, no queues
            assert rejected.status == 429
        async with http.get(gw.url + "/dashboard/events") as events:
            _, rows = await next_event(events)
        sim_big.release()
        sim_small.release()
        async with await overflowed as resp:
            assert resp.headers["x-slotgate-backend"] == "small"
            assert resp.headers["x-slotgate-route-reason"].startswith("fallback:")
            await resp.read()
        async with await first as resp:
            await resp.read()
    by_name = {r["name"]: r for r in rows}
    assert by_name["big"]["rejected_1m"] == 1 and by_name["small"]["rejected_1m"] == 0
    await assert_idle(gw)
    by_name = {r["name"]: r for r in pool_rows(gw.gateway)}
    assert by_name["small"]["fallback_1m"] == 1 and by_name["big"]["fallback_1m"] == 0
    assert by_name["big"]["rejected_1m"] == 1
    later = {r["name"]: r for r in pool_rows(gw.gateway, now=time.perf_counter() + 61)}
    assert later["big"]["rejected_1m"] == 0 and later["small"]["fallback_1m"] == 0


async def test_shutdown_ends_dashboard_streams() -> None:
    gw = await start_gateway(config_from_dict(gateway_config(sim_backend("big-70b", slots=1))),
                             "127.0.0.1", 0)
    async with aiohttp.ClientSession() as http:
        async with http.get(gw.url + "/dashboard/events") as events:
            await next_event(events)
            async with asyncio.timeout(5):  # not the 30 s shutdown timeout
                await gw.close()
                assert await events.content.read() == b""


async def test_idle_feed_sends_heartbeat_comments(
    start: StartGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("router.console.pages.HEARTBEAT_S", 0.05)
    gw = await start(gateway_config(sim_backend("big-70b", slots=1)))
    async with aiohttp.ClientSession() as http:
        async with http.get(gw.url + "/dashboard/events") as events:
            await next_event(events)
            async with asyncio.timeout(5):
                assert await events.content.readline() == b": heartbeat\n"
                assert await events.content.readline() == b"\n"
    await gw.app[PAGES].wait_subscribers(0)
    await assert_idle(gw)
