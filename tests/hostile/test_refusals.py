"""Cheap refusals stay cheap: a flood of requests without a valid key writes no ledger
row, is counted in metrics and costs a few sampled access lines; the ledger is bounded
by size as well as by age, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from policies.config import LedgerConfig
from router.common.config_error import ConfigError
from router.config import config_from_dict
from router.ledger.base import LedgerRow, RowFilter
from router.ledger.open import open_ledger, open_store
from router.request.access_log import LogSampler
from tests.hostile.keys import (
    BODY,
    KEY,
    access_lines,
    bearer,
    scrape,
    value,
    with_auth,
)
from tests.support import StartGateway, assert_idle, gateway_config, rows_of, sim_backend


async def test_an_unauthenticated_flood_writes_no_ledger_row_and_few_log_lines(
    start: StartGateway, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = str(tmp_path / "ledger.sqlite3")
    raw = with_auth(gateway_config(sim_backend("m", slots=2)))
    raw["ledger"] = {"path": ledger}
    gw = await start(raw)
    flood, at_once = 500, 50
    with caplog.at_level(logging.INFO, logger="slotgate.access"):
        async with aiohttp.ClientSession() as http:
            async def refused(i: int) -> None:
                headers = bearer(f"sk-wrong-{i}") if i % 2 else {}  # wrong key, or none
                async with http.post(gw.url + "/v1/chat/completions", json=BODY,
                                     headers=headers) as resp:
                    assert resp.status == 401
                    assert (await resp.json())["error"]["code"] == "invalid_api_key"

            began = time.monotonic()
            for first in range(0, flood, at_once):
                await asyncio.gather(*(refused(i) for i in range(first, first + at_once)))
            elapsed = time.monotonic() - began
            # a caller with the key is served and logged as before, one line per request
            for _ in range(3):
                async with http.post(gw.url + "/v1/chat/completions", json=BODY,
                                     headers=bearer(KEY)) as resp:
                    assert resp.status == 200
            async with http.post(gw.url + "/v1/chat/completions", headers=bearer(KEY),
                                 json={**BODY, "model": "nope"}) as resp:
                assert resp.status == 404  # a known caller's refusal: logged and kept
    samples = await scrape(gw)
    assert value(samples, "slotgate_auth_failures_total", code="invalid_api_key") == flood
    assert value(samples, "slotgate_requests_total", route="unknown", backend="none",
                 status_class="4xx", api="chat") == flood + 1
    assert value(samples, "slotgate_requests_total", route="chat", backend="big",
                 status_class="2xx", api="chat") == 3
    lines = access_lines(caplog)
    sampled = [line for line in lines if line["status"] == 401]
    # at most one line per second of flood (the sampling interval), each saying how many
    # were left out before it
    assert 1 <= len(sampled) <= elapsed / 1.0 + 1
    assert sum(1 + line.get("suppressed", 0) for line in sampled) <= flood
    assert [line["status"] for line in lines if line["status"] != 401] == [200, 200, 200, 404]
    # nor do they push real requests out of the records the dashboard counts from
    assert [r.status for r in gw.gateway.recent] == [200, 200, 200, 404]
    await assert_idle(gw)
    rows = await rows_of(gw, ledger)
    assert [(r.status, r.key_id) for r in rows] == [
        (200, "team"), (200, "team"), (200, "team"), (404, "team")]


async def test_refusals_before_the_caller_is_known_all_behave_alike(
    start: StartGateway, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No key, a wrong key, two keys, an unknown path: counted, never a ledger row."""
    ledger = str(tmp_path / "ledger.sqlite3")
    raw = with_auth(gateway_config(sim_backend("m", slots=1)))
    raw["ledger"] = {"path": ledger}
    raw["logging"] = {"refusal_interval_s": 3600}  # one line per status, then silence
    gw = await start(raw)
    with caplog.at_level(logging.INFO, logger="slotgate.access"):
        async with aiohttp.ClientSession() as http:
            for _ in range(20):
                async with http.post(gw.url + "/v1/completions",
                                     json={"model": "chat", "prompt": "x"}) as resp:
                    assert resp.status == 401
                async with http.get(gw.url + "/no/such/path") as resp:
                    assert resp.status == 401  # nothing about the paths without a key
                    assert (await resp.json())["error"]["code"] == "invalid_api_key"
            async with http.get(gw.url + "/no/such/path", headers=bearer(KEY)) as resp:
                assert resp.status == 404
    samples = await scrape(gw)
    assert value(samples, "slotgate_auth_failures_total", code="invalid_api_key") == 40
    assert [line["status"] for line in access_lines(caplog)] == [401]  # sampled
    await assert_idle(gw)
    assert await rows_of(gw, ledger) == []


def test_the_sampler_lets_one_line_a_second_through_and_counts_the_rest() -> None:
    now = [100.0]
    sampler = LogSampler(clock=lambda: now[0])
    assert sampler.admit(401, 1.0) == 0  # the first one is written
    assert [sampler.admit(401, 1.0) for _ in range(5)] == [None] * 5
    assert sampler.admit(400, 1.0) == 0  # per status
    now[0] += 0.99
    assert sampler.admit(401, 1.0) is None
    now[0] += 0.02
    assert sampler.admit(401, 1.0) == 6  # said with the next line written
    assert sampler.admit(401, 0.0) == 0  # interval 0: every line


def rows(count: int, start_ts: float) -> list[LedgerRow]:
    return [LedgerRow(
        id=f"row-{i:04d}", ts=start_ts + i, request_id=f"r{i}", endpoint="/v1/chat/completions",
        route="chat", primary="big", experiment=None, arm=None, tenant=None, backend="big",
        reason="primary", intent=None, p_simple=None, stream=False, status=200, error=None,
        disconnect=None, queue_wait_ms=0.0, ttft_ms=1.0, total_ms=2.0, slot_ms=1.0,
        prompt_tokens=1, completion_tokens=1, tokens_estimated=False, cost=0.0,
        counterfactual_cost=0.0) for i in range(count)]


def ledger_config(target: str, **extra: Any) -> LedgerConfig:
    postgres = target.startswith("postgresql://")
    where: dict[str, Any] = {"url": target} if postgres else {"path": target}
    return LedgerConfig(**where, **extra)


async def test_max_rows_bounds_the_ledger(ledger_target: str) -> None:
    """The purge at startup (and hourly) keeps the newest `max_rows` rows."""
    now = time.time()
    ledger = open_ledger(ledger_config(ledger_target, max_rows=None))
    await ledger.start()
    for row in rows(25, now - 100):
        ledger.add(row)
    await ledger.close()

    ledger = open_ledger(ledger_config(ledger_target, max_rows=10))
    await ledger.start()  # purges: age, then size
    kept = await ledger.store.fetch(RowFilter())
    assert [r.id for r in kept] == [f"row-{i:04d}" for i in range(15, 25)]  # the newest
    assert await ledger.store.trim(10) == 0  # already within the bound
    for row in rows(3, now + 1):  # three newer rows (ids reused: a fresh table's worth)
        ledger.add(row._replace(id="new-" + row.id))
    await ledger.flush()
    assert await ledger.store.trim(10) == 3  # the three oldest go
    kept = await ledger.store.fetch(RowFilter())
    assert len(kept) == 10 and kept[0].id == "row-0018" and kept[-1].id == "new-row-0002"
    await ledger.close()


async def test_max_rows_below_the_row_count_of_an_empty_table_deletes_nothing(
    ledger_target: str
) -> None:
    store = open_store(ledger_target)
    await store.open()
    try:
        assert await store.trim(1) == 0
    finally:
        await store.close()


def test_max_rows_is_validated() -> None:
    raw = gateway_config(sim_backend("m", slots=1))
    for bad in (0, -5, "many"):
        with pytest.raises(ConfigError):
            config_from_dict({**raw, "ledger": {"path": "x.sqlite3", "max_rows": bad}})
    assert config_from_dict(raw).ledger.max_rows == 10_000_000  # bounded by default
    unbounded = config_from_dict({**raw, "ledger": {"path": "x.sqlite3", "max_rows": None}})
    assert unbounded.ledger.max_rows is None
