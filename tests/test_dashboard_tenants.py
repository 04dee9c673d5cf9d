"""The dashboard's tenant table: each busy pool's tenants, their share of its tokens
served in the last minute and their waiting requests, in the feed and in a real headless
Chromium (Debian's, driven by Playwright). Waits are pool states and DOM conditions."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from router.common.record import RequestRecord
from router.console.pages import WINDOW_S, pool_rows
from router.console.shares import tenant_shares
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

if TYPE_CHECKING:
    from playwright.async_api import Browser

    from router.app import RunningGateway


async def served_then_queued(gw: RunningGateway, sdk: SdkClients
                             ) -> tuple[dict[str, int], list[asyncio.Task[Any]]]:
    """acme is served twice and beta once; then, the engine held, one of acme's runs and
    one of beta's waits. Returns the tokens each was served, and the held requests."""
    clients = {tenant: sdk(gw, api_key=key) for tenant, key in KEYS.items()}
    served = {"acme": 0, "beta": 0}
    for tenant in ("acme", "beta", "acme"):
        answer = await clients[tenant].chat.completions.create(model="chat",
                                                               messages=MESSAGES)
        assert answer.usage is not None
        served[tenant] += answer.usage.total_tokens
    engine(gw).hold()
    held = []
    for tenant, state in (("acme", (1, 0)), ("beta", (1, 1))):
        held.append(asyncio.create_task(clients[tenant].chat.completions.create(
            model="chat", messages=MESSAGES)))

        def reached(s: dict[str, tuple[int, int]], state: tuple[int, int] = state) -> bool:
            return s["big"] == state

        await wait_pools(gw, reached)
    return served, held


async def test_the_feed_has_a_busy_pools_tenants(start: StartGateway, sdk: SdkClients) -> None:
    gw = await start(with_tenants(gateway_config(sim_backend("m", slots=1, queue_limit=2))))
    assert pool_rows(gw.gateway)[0]["tenants"] == []  # no queue: no table
    served, held = await served_then_queued(gw, sdk)
    total = sum(served.values())
    rows = pool_rows(gw.gateway)[0]["tenants"]
    assert rows == [
        {"tenant": "acme", "tokens": served["acme"],
         "share": round(served["acme"] / total, 4), "waiting": 0},  # its request runs
        {"tenant": "beta", "tokens": served["beta"],
         "share": round(served["beta"] / total, 4), "waiting": 1},
    ]
    engine(gw).release()
    await asyncio.gather(*held)
    assert pool_rows(gw.gateway)[0]["tenants"] == []
    await assert_idle(gw)


class TenantLine:
    """A line that tells its waiters' tenants (what a `fair` pool offers the dashboard)."""

    def __init__(self, waiting: Mapping[str, int]) -> None:
        self.waiting = waiting

    def tenants(self) -> Mapping[str, int]:
        return self.waiting


def test_waiters_by_tenant_when_the_pool_tells() -> None:
    def rec(tenant: str | None, ended: float, tokens: int, backend: str = "big"
            ) -> RequestRecord:
        return RequestRecord("r", "chat", ended, 0.0, "r", tenant=tenant, backend=backend,
                             prompt_tokens=tokens, completion_tokens=0)

    recent = [rec("acme", 0.0, 1000),  # ended before the window
              rec("acme", 100.0, 30), rec("beta", 101.0, 10), rec("x1f3", 102.0, 20),
              rec("acme", 103.0, 40, backend="small")]
    label = {"acme": "acme", "beta": "beta"}.get
    shares = tenant_shares(recent, {"big": TenantLine({"acme": 1, "zed": 2, "q": 1})},
                           lambda t: label(t or "", "other"), 103.0 - WINDOW_S + 1)
    assert shares == {"big": [
        {"tenant": "acme", "tokens": 30, "share": 0.5, "waiting": 1},
        {"tenant": "other", "tokens": 20, "share": round(20 / 60, 4), "waiting": 3},
        {"tenant": "beta", "tokens": 10, "share": round(10 / 60, 4), "waiting": 0},
    ]}


async def test_the_dashboard_shows_the_tenants_share(
    sdk: SdkClients, start: StartGateway, browser: Browser
) -> None:
    gw = await start(with_tenants(gateway_config(sim_backend("m", slots=1, queue_limit=2))))
    served, held = await served_then_queued(gw, sdk)
    total = sum(served.values())
    dash = await browser.new_page(viewport={"width": 1000, "height": 700})
    errors: list[str] = []
    dash.on("pageerror", lambda exc: errors.append(str(exc)))
    dash.set_default_timeout(10_000)
    await dash.goto(gw.url + "/dashboard")  # the feed is public here (`auth.public: pages`)
    await dash.wait_for_function("""() => {
        const box = document.querySelector('[data-pool="big"] .tenants');
        return box && !box.hidden && box.querySelectorAll('tbody tr').length === 2;
    }""")
    rows = await dash.locator('[data-pool="big"] .tenants tbody tr').evaluate_all(
        "rows => rows.map(r => [r.dataset.tenant, ...[...r.cells].map(c => c.textContent)])")
    assert rows == [
        ["acme", "acme", str(served["acme"]), f"{100 * served['acme'] / total:.1f}%", "0"],
        ["beta", "beta", str(served["beta"]), f"{100 * served['beta'] / total:.1f}%", "1"],
    ]
    assert await dash.get_by_role("table", name="Tenants · tokens served (1 min)").count() == 1
    engine(gw).release()
    await asyncio.gather(*held)
    await dash.wait_for_function(
        "() => document.querySelector('[data-pool=\"big\"] .tenants').hidden")
    assert errors == []
    await dash.close()
    await assert_idle(gw)
