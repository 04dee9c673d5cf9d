"""Who sees which tenants: with auth on, every tenant's series in /metrics and rows in
/dashboard/events go to admin keys and `metrics`-scoped scrape keys only; an ordinary key
sees its own tenant's, a keyless caller of a public endpoint none (unless the operator
opens them with `auth.public: [tenants]`)."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from router.app import RunningGateway
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    sim_backend,
    wait_pools,
)
from tests.support.tenants import KEYS, with_tenants

ADMIN, SCRAPER = "sk-admin-0123456789", "sk-scrape-0123456789"
TOKENS = "slotgate_tenant_tokens_total"


def config(public: list[str]) -> dict[str, Any]:
    raw = with_tenants(gateway_config(sim_backend("m", slots=1, queue_limit=2)))
    raw["auth"]["public"] = public
    for key_id, key, extra in (("ops-admin", ADMIN, {"admin": True}),
                               ("scrape", SCRAPER, {"scopes": ["metrics"]})):
        raw["auth"]["keys"].append({"id": key_id, "tenant": "acme", **extra,
                                    "sha256": hashlib.sha256(key.encode()).hexdigest()})
    return raw


def _headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


async def tenants_in_metrics(gw: RunningGateway, key: str | None) -> set[str]:
    async with aiohttp.ClientSession() as http, \
            http.get(gw.url + "/metrics", headers=_headers(key)) as resp:
        assert resp.status == 200
        text = await resp.text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "llm_active_slots_gauge" in families  # the rest of the exposition is there
    return {s.labels["tenant"] for name, f in families.items() if name.startswith(
        "slotgate_tenant_") for s in f.samples}


async def tenants_in_feed(gw: RunningGateway, key: str | None) -> set[str]:
    """The tenants named in the feed's first `pools` event."""
    async with aiohttp.ClientSession() as http, \
            http.get(gw.url + "/dashboard/events", headers=_headers(key)) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: "):
                rows = orjson.loads(line[6:])
                return {t["tenant"] for row in rows for t in row["tenants"]}
    raise AssertionError("the feed ended without an event")


async def busy(gw: RunningGateway, sdk: SdkClients) -> list[asyncio.Task[Any]]:
    """Both tenants served once; then one of acme's runs (held) and one of beta's waits."""
    clients = {tenant: sdk(gw, api_key=key) for tenant, key in KEYS.items()}
    for client in clients.values():
        await client.chat.completions.create(model="chat", messages=MESSAGES)
    engine(gw).hold()
    held = [asyncio.create_task(clients["acme"].chat.completions.create(
        model="chat", messages=MESSAGES))]
    await wait_pools(gw, lambda s: s["big"] == (1, 0))
    held.append(asyncio.create_task(clients["beta"].chat.completions.create(
        model="chat", messages=MESSAGES)))
    await wait_pools(gw, lambda s: s["big"] == (1, 1))
    return held


async def test_each_key_sees_what_it_may(start: StartGateway, sdk: SdkClients) -> None:
    gw = await start(config(["metrics", "pages"]))
    held = await busy(gw, sdk)
    everyone = {"acme", "beta"}
    for key, metrics, feed in ((ADMIN, everyone | {"other"}, everyone),
                               (SCRAPER, everyone | {"other"}, everyone),
                               (KEYS["beta"], {"beta"}, {"beta"}),
                               (KEYS["acme"], {"acme"}, {"acme"}),
                               (None, set(), set()),  # public, without a key
                               ("sk-wrong", set(), set())):  # public: a wrong key is none
        assert await tenants_in_metrics(gw, key) == metrics, key
        assert await tenants_in_feed(gw, key) == feed, key
    engine(gw).release()
    await asyncio.gather(*held)
    await assert_idle(gw)


async def test_not_public_needs_a_key_and_public_tenants_open_all(
    start: StartGateway, sdk: SdkClients
) -> None:
    gw = await start(config([]))
    async with aiohttp.ClientSession() as http, http.get(gw.url + "/metrics") as resp:
        assert resp.status == 401
    assert await tenants_in_metrics(gw, KEYS["beta"]) == {"beta"}
    assert await tenants_in_metrics(gw, SCRAPER) == {"acme", "beta", "other"}
    opened = await start(config(["metrics", "tenants"]))  # the operator's choice: as before
    assert await tenants_in_metrics(opened, None) == {"acme", "beta", "other"}
    assert await tenants_in_metrics(opened, KEYS["beta"]) == {"acme", "beta", "other"}
    async with aiohttp.ClientSession() as http, http.get(opened.url + "/openapi.json",
                                                         headers=_headers(ADMIN)) as resp:
        assert resp.status == 200  # `tenants` opens no path of its own
