"""GET /admin/report: the JSON report over a live gateway's ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp

from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    gateway_config,
    sim_backend,
)


def config(tmp_path: Path) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m-big", slots=2, price={"gpu_hour": 3.6, "gpus": 2}),
                         sim_backend("m-small", slots=2), overflow="fallback")
    raw["ledger"] = {"path": str(tmp_path / "ledger.sqlite3"), "flush_interval_s": 60}
    raw["experiments"] = {"fb": {"route": "chat", "arms": {
        "off": {"fallback": {"when": "never"}}, "on": {}}}}
    return raw


async def test_report_covers_rows_not_yet_flushed(
    sdk: SdkClients, start: StartGateway, tmp_path: Path
) -> None:
    gw = await start(config(tmp_path))
    arms = set()
    for i in range(12):
        reply = await sdk(gw).chat.completions.with_raw_response.create(
            model="chat", messages=MESSAGES, user=f"user-{i}")
        arms.add(reply.headers["x-slotgate-arm"])
    await assert_idle(gw)
    assert gw.gateway.ledger is not None and gw.gateway.ledger.pending == 12  # none written
    async with aiohttp.ClientSession() as http:
        async with http.get(gw.url + "/admin/report", params={"experiment": "fb"}) as resp:
            assert resp.status == 200
            report = await resp.json()
    assert report["header"]["rows"] == 12 and report["header"]["experiments"] == ["fb"]
    assert {a["arm"] for a in report["arms"]} == arms == {"off", "on"}
    assert report["total"]["requests"] == 12 and report["total"]["cost"] > 0
    assert len(report["comparisons"]) == 1


async def test_report_errors_are_openai_shaped(start: StartGateway, tmp_path: Path) -> None:
    gw = await start(config(tmp_path))
    plain = await start(gateway_config(sim_backend("m", slots=1)))  # no ledger
    async with aiohttp.ClientSession() as http:
        for url, params, status, code in (
            (gw.url, {"since": "yesterday-ish"}, 400, "invalid_time"),
            (gw.url, {"experiment": "nothing-here"}, 404, "no_rows"),
            (gw.url, {"since": "x" * 300}, 400, None),
            (plain.url, {}, 404, "ledger_off"),
        ):
            async with http.get(url + "/admin/report", params=params) as resp:
                body = await resp.json()
                assert resp.status == status, body
                assert set(body["error"]) >= {"message", "type", "code"}
                if code is not None:
                    assert body["error"]["code"] == code
