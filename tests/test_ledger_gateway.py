"""Ledger rows written by a real gateway, read back from SQLite and from the real PostgreSQL.

Each test closes its gateway (a graceful shutdown flushes the ledger) and reads the store.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai
import pytest

from router.app import RunningGateway
from router.common.config_error import ConfigError
from router.ledger.base import LedgerRow
from router.ledger.open import open_store
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    rows_of,
    sim_backend,
    wait_pools,
)

GPU = {"gpu_hour": 3.6, "gpus": 1}  # one slot: $0.001 per slot-second
TOKENS = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}


def config(target: str, **primary: Any) -> dict[str, Any]:
    raw = gateway_config(
        sim_backend("m-big", slots=1, price=GPU, initial_hold_s=2.0, **primary),
        sim_backend("m-small", slots=2, price=TOKENS), overflow="fallback")
    raw["ledger"] = {"url" if target.startswith("postgres") else "path": target}
    return raw


async def test_successful_requests_are_priced(
    sdk: SdkClients, start: StartGateway, ledger_target: str
) -> None:
    gw = await start(config(ledger_target))
    client = sdk(gw, default_headers={"X-Request-Id": "same"})  # a client reusing its id
    plain = await client.chat.completions.create(model="chat", messages=MESSAGES)
    chunks = [c async for c in await client.chat.completions.create(
        model="chat", messages=MESSAGES, stream=True)]
    assert plain.usage is not None and chunks
    await assert_idle(gw)
    rows = await rows_of(gw, ledger_target)
    assert [r.stream for r in rows] == [False, True]
    for r in rows:
        assert (r.status, r.backend, r.primary, r.route) == (200, "big", "big", "chat")
        assert (r.prompt_tokens, r.completion_tokens) == (plain.usage.prompt_tokens, 8)
        assert not r.tokens_estimated  # the gateway asked the engine for stream usage
        assert r.slot_ms > 0 and r.total_ms >= r.slot_ms
        assert r.cost == pytest.approx(r.slot_ms / 1000 * 0.001)
        assert r.counterfactual_cost == r.cost  # it ran on the primary
        assert r.ttft_ms is not None and r.request_id == "same"
        assert r.endpoint == "/v1/chat/completions"
    assert len({r.id for r in rows}) == 2  # both kept: the ledger's key is the gateway's


async def test_rejections_and_queue_timeouts_cost_nothing(
    sdk: SdkClients, start: StartGateway, ledger_target: str
) -> None:
    async def held_with_one_waiter(queue_timeout_s: float
                                   ) -> tuple[RunningGateway, asyncio.Task[Any], asyncio.Task[Any]]:
        raw = config(ledger_target, queue_limit=1, queue_timeout_s=queue_timeout_s)
        raw["routes"]["chat"]["overflow"] = "reject"
        gw = await start(raw)
        engine(gw).hold()
        holder = asyncio.create_task(sdk(gw).chat.completions.create(model="chat",
                                                                     messages=MESSAGES))
        await wait_pools(gw, lambda s: s["big"] == (1, 0))
        waiter = asyncio.create_task(sdk(gw).chat.completions.create(model="chat",
                                                                     messages=MESSAGES))
        await wait_pools(gw, lambda s: s["big"] == (1, 1))
        return gw, holder, waiter

    # The queue full (its waiter in no hurry): 429.
    gw, holder, waiter = await held_with_one_waiter(queue_timeout_s=60)
    with pytest.raises(openai.RateLimitError):
        await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)
    engine(gw).release()
    await asyncio.gather(holder, waiter)
    await assert_idle(gw)
    await gw.close()  # every row written; the next gateway adds to the same ledger
    # A wait run out: 503.
    gw, holder, waiter = await held_with_one_waiter(queue_timeout_s=0.2)
    with pytest.raises(openai.InternalServerError):
        await waiter
    engine(gw).release()
    await holder
    await assert_idle(gw)
    rows = {r.status: r for r in await rows_of(gw, ledger_target)}
    assert set(rows) == {200, 429, 503}
    assert rows[429].error == "queue_full" and rows[503].error == "queue_timeout"
    assert rows[503].queue_wait_ms >= 190  # it waited out its 0.2 s in line
    for status in (429, 503):
        assert rows[status].cost == rows[status].counterfactual_cost == 0
        assert rows[status].completion_tokens == 0 and rows[status].slot_ms == 0
    assert rows[200].cost > 0


async def test_a_stream_cut_mid_way_counts_the_tokens_streamed(
    sdk: SdkClients, start: StartGateway, ledger_target: str
) -> None:
    gw = await start(config(ledger_target))
    sim = engine(gw)
    sim.hold(after_tokens=3)
    stream = await sdk(gw).chat.completions.create(
        model="chat", messages=MESSAGES, stream=True, extra_headers={"X-Request-Id": "cut"})
    assert (await stream.__anext__()).choices
    await stream.close()
    await sim.wait_until(lambda e: e.records["cut"].aborted)
    await assert_idle(gw)
    [row] = await rows_of(gw, ledger_target)
    assert (row.status, row.disconnect, row.request_id) == (499, "streaming", "cut")
    assert row.completion_tokens == sim.records["cut"].completion_tokens == 3
    assert row.tokens_estimated and row.prompt_tokens > 0  # no usage came: the gateway counted
    assert row.cost == pytest.approx(row.slot_ms / 1000 * 0.001) and row.cost > 0


async def test_fallback_rows_carry_the_primary_counterfactual(
    sdk: SdkClients, start: StartGateway, ledger_target: str
) -> None:
    gw = await start(config(ledger_target))
    sim = engine(gw)
    sim.hold()
    holder = asyncio.create_task(sdk(gw).chat.completions.create(model="chat",
                                                                 messages=MESSAGES))
    await wait_pools(gw, lambda s: s["big"] == (1, 0))
    moved = await sdk(gw).chat.completions.with_raw_response.create(
        model="chat", messages=MESSAGES)  # the primary's queue holds 0: overflow
    assert moved.headers["x-slotgate-backend"] == "small"
    sim.release()
    await holder
    await assert_idle(gw)
    rows = await rows_of(gw, ledger_target)
    [small] = [r for r in rows if r.backend == "small"]
    assert small.reason == "fallback:overflow" and small.primary == "big"
    # per token: 1 $/M in, 2 $/M out
    expected = (small.prompt_tokens * 1.0 + small.completion_tokens * 2.0) / 1e6
    assert small.cost == pytest.approx(expected)
    # nothing measured on the primary before it: its initial 2 s hold at $0.001/s
    assert small.counterfactual_cost == pytest.approx(0.002)


async def test_restart_loses_nothing_and_duplicates_nothing(
    sdk: SdkClients, start: StartGateway, ledger_target: str
) -> None:
    raw = config(ledger_target)
    raw["ledger"]["flush_interval_s"] = 60  # only the shutdown flush writes
    ids: list[str] = []
    for _ in range(2):
        gw = await start(raw)
        for _ in range(3):
            reply = await sdk(gw).chat.completions.with_raw_response.create(
                model="chat", messages=MESSAGES)
            ids.append(reply.headers["x-request-id"])
        await assert_idle(gw)
        await gw.close()
    rows = await rows_of(gw, ledger_target)
    assert [r.request_id for r in rows] == ids and len({r.id for r in rows}) == 6


async def test_experiment_arms_are_sticky_and_recorded(
    sdk: SdkClients, start: StartGateway, ledger_target: str
) -> None:
    raw = config(ledger_target)
    raw["routes"]["chat"]["fallback"] = {"when": "saturated"}
    raw["experiments"] = {"fb": {"route": "chat", "arms": {
        "off": {"fallback": {"when": "never"}}, "on": {}}}}
    gw = await start(raw)
    seen: dict[str, set[str]] = {}
    for user in ("alice", "bob", "carol", "dave", "erin", "frank"):
        for _ in range(3):
            reply = await sdk(gw).chat.completions.with_raw_response.create(
                model="chat", messages=MESSAGES, user=user)
            assert reply.headers["x-slotgate-experiment"] == "fb"
            seen.setdefault(user, set()).add(reply.headers["x-slotgate-arm"])
    assert all(len(arms) == 1 for arms in seen.values())  # sticky
    await assert_idle(gw)
    rows = await rows_of(gw, ledger_target)
    assert len(rows) == 18
    assert {r.experiment for r in rows} == {"fb"}
    assert [r.arm for r in rows] == [next(iter(seen[u])) for u in seen for _ in range(3)]


async def test_retention_removes_old_rows_at_startup(
    sdk: SdkClients, start: StartGateway, ledger_target: str
) -> None:
    old = LedgerRow(
        id="old", ts=time.time() - 10 * 86_400, request_id="old", endpoint="/v1/completions",
        route="chat", primary="big", experiment=None, arm=None, tenant=None, backend="big",
        reason="primary", intent=None, p_simple=None, stream=False, status=200, error=None,
        disconnect=None, queue_wait_ms=0.0, ttft_ms=1.0, total_ms=2.0, slot_ms=2.0,
        prompt_tokens=1, completion_tokens=1, tokens_estimated=False, cost=0.0,
        counterfactual_cost=0.0)
    store = open_store(ledger_target)
    await store.open()
    await store.write([old, old._replace(id="recent", ts=time.time() - 86_400)])
    await store.close()
    raw = config(ledger_target)
    raw["ledger"]["retention_days"] = 7
    gw = await start(raw)
    await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)
    await assert_idle(gw)
    rows = await rows_of(gw, ledger_target)
    assert [r.id for r in rows][:1] == ["recent"] and len(rows) == 2  # "old" is gone


async def test_a_dsn_with_a_password_can_stay_out_of_the_file(
    sdk: SdkClients, start: StartGateway, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLOTGATE_LEDGER_DSN", postgres_url)
    raw = config(postgres_url)
    raw["ledger"] = {"url_env": "SLOTGATE_LEDGER_DSN"}
    gw = await start(raw)
    await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)
    await assert_idle(gw)
    assert [r.status for r in await rows_of(gw, postgres_url)] == [200]
    monkeypatch.delenv("SLOTGATE_LEDGER_DSN")
    with pytest.raises(ConfigError, match="SLOTGATE_LEDGER_DSN is not set"):
        await start(raw)
