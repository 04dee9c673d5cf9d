"""Per-key priority classes, concurrency caps and budgets, through the gateway with the
official SDK; and the period arithmetic of `policies.limits.quotas`."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from policies.config import ApiKeyConfig, BudgetConfig
from policies.limits.quotas import QuotaHold, Quotas, Refusal, period_bounds
from router.app import RunningGateway
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    rows_of,
    sim_backend,
)

KEYS = {name: f"sk-{name}-0123456789" for name in ("gold", "team", "batch", "capped", "metered")}


def client(sdk: SdkClients, gw: RunningGateway, name: str, **headers: str) -> AsyncOpenAI:
    return sdk(gw, api_key=KEYS[name], default_headers=headers or None)


def key(name: str, **limits: Any) -> dict[str, Any]:
    return {"id": name, "tenant": name, "sha256": hashlib.sha256(KEYS[name].encode()).hexdigest(),
            **limits}


def config(tmp_path: Path, slots: int = 1, queue_limit: int = 2) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=slots, queue_limit=queue_limit,
                                     sim={"output_tokens": 10}))
    raw["ledger"] = {"path": str(tmp_path / "ledger.sqlite3")}
    raw["auth"] = {"enabled": True, "keys": [
        key("gold", priority="critical"),
        key("team"),
        key("batch", priority="sheddable"),
        key("capped", max_concurrent=1),
        key("metered", budgets=[{"period": "day", "tokens": 40}]),
    ]}
    return raw


async def ask(
    sdk: SdkClients, gw: RunningGateway, name: str, request_id: str, **headers: str
) -> str:
    reply = await client(sdk, gw, name, **{"X-Request-Id": request_id, **headers}
                         ).chat.completions.create(model="chat", messages=MESSAGES)
    return reply.choices[0].message.content or ""


async def queued(gw: RunningGateway, n: int) -> None:
    pool = gw.gateway.backends["big"].pool
    async with asyncio.timeout(10):
        while pool.queued != n:
            await pool.next_change()


async def test_critical_first_and_a_full_queue_sheds_the_sheddable(
    sdk: SdkClients, start: StartGateway, tmp_path: Path
) -> None:
    gw = await start(config(tmp_path))
    sim = engine(gw)
    sim.hold()
    running = asyncio.create_task(ask(sdk, gw, "team", "running"))
    await sim.wait_until(lambda e: e.active == 1)
    batch = asyncio.create_task(ask(sdk, gw, "batch", "batch"))
    await queued(gw, 1)
    team = asyncio.create_task(ask(sdk, gw, "team", "team"))
    await queued(gw, 2)
    assert gw.gateway.backends["big"].pool.snapshot().sheddable == 1
    gold = asyncio.create_task(ask(sdk, gw, "gold", "gold"))  # the queue is full: batch goes
    with pytest.raises(openai.RateLimitError) as shed:
        await batch
    assert shed.value.body["code"] == "shed"  # type: ignore[index]
    assert int(shed.value.response.headers["retry-after"]) >= 1
    with pytest.raises(openai.RateLimitError) as full:  # sheddable: nobody to displace
        await ask(sdk, gw, "batch", "late")
    assert full.value.body["code"] == "queue_full"  # type: ignore[index]
    await queued(gw, 2)
    sim.release()
    assert all(await asyncio.gather(running, team, gold))
    served = sorted((r for r in gw.gateway.recent if r.slot_at), key=lambda r: r.slot_at or 0)
    assert [r.request_id for r in served] == ["running", "gold", "team"]
    assert {r.request_id: r.priority for r in served}["gold"] == "critical"
    await assert_idle(gw)


async def test_a_client_may_lower_its_class_but_not_raise_it(
    sdk: SdkClients, start: StartGateway, tmp_path: Path
) -> None:
    gw = await start(config(tmp_path, slots=2))
    await ask(sdk, gw, "gold", "lowered", **{"x-slotgate-priority": "sheddable"})
    await ask(sdk, gw, "team", "raised", **{"x-slotgate-priority": "critical"})
    await ask(sdk, gw, "gold", "nonsense", **{"x-slotgate-priority": "urgent!"})
    classes = {r.request_id: r.priority for r in gw.gateway.recent}
    assert classes == {"lowered": "sheddable", "raised": "standard", "nonsense": "critical"}


async def test_concurrency_cap_per_key(
    sdk: SdkClients, start: StartGateway, tmp_path: Path
) -> None:
    gw = await start(config(tmp_path, slots=2))
    sim = engine(gw)
    sim.hold()
    first = asyncio.create_task(ask(sdk, gw, "capped", "first"))
    await sim.wait_until(lambda e: e.active == 1)
    with pytest.raises(openai.RateLimitError) as capped:
        await ask(sdk, gw, "capped", "second")
    assert capped.value.body["code"] == "concurrency_limit"  # type: ignore[index]
    assert capped.value.response.headers["x-slotgate-reject-reason"] == "concurrency_limit"
    other = asyncio.create_task(ask(sdk, gw, "team", "other-key"))
    await sim.wait_until(lambda e: e.active == 2)  # others are not limited by it
    sim.release()
    assert all(await asyncio.gather(first, other))
    assert await ask(sdk, gw, "capped", "third")  # the cap counts requests running, not made
    assert gw.gateway.quotas.running("capped") == 0
    await assert_idle(gw)


async def test_token_budget_then_429_and_it_survives_a_restart(
    sdk: SdkClients, start: StartGateway, tmp_path: Path
) -> None:
    raw = config(tmp_path)
    gw = await start(raw)
    metered = client(sdk, gw, "metered")
    with pytest.raises(openai.NotFoundError):  # refused before it takes anything
        await metered.chat.completions.create(model="nope", messages=MESSAGES)
    used = 0
    while used < 40:  # each answer is 10 tokens plus the prompt's
        reply = await metered.chat.completions.create(model="chat", messages=MESSAGES)
        assert reply.usage is not None
        used += reply.usage.total_tokens
    asked_at = datetime.now(UTC).timestamp()  # no later than the gateway's own clock read
    with pytest.raises(openai.RateLimitError) as over:
        await metered.chat.completions.create(model="chat", messages=MESSAGES)
    body: Any = over.value.body
    assert body["code"] == "budget_exceeded" and body["type"] == "insufficient_quota"
    assert "40 tokens" in body["message"]
    _, midnight = period_bounds("day", asked_at)
    assert 1 <= int(over.value.response.headers["retry-after"]) <= midnight - asked_at + 1
    assert await ask(sdk, gw, "team", "unmetered")

    rows = await rows_of(gw, str(tmp_path / "ledger.sqlite3"))  # closes: a restart
    spent = sum(r.prompt_tokens + r.completion_tokens for r in rows if r.key_id == "metered")
    assert spent == used  # the refused requests (404, 429) spent nothing
    again = await start(raw)
    with pytest.raises(openai.RateLimitError) as still:
        await client(sdk, again, "metered").chat.completions.create(model="chat",
                                                               messages=MESSAGES)
    assert still.value.body["code"] == "budget_exceeded"  # type: ignore[index]


def test_periods_are_utc_calendar_periods() -> None:
    at = datetime(2026, 12, 31, 23, 30, tzinfo=UTC).timestamp()
    assert period_bounds("hour", at) == (datetime(2026, 12, 31, 23, tzinfo=UTC).timestamp(),
                                         datetime(2027, 1, 1, tzinfo=UTC).timestamp())
    assert period_bounds("month", at) == (datetime(2026, 12, 1, tzinfo=UTC).timestamp(),
                                          datetime(2027, 1, 1, tzinfo=UTC).timestamp())


def test_a_new_period_renews_the_budget_and_a_reload_keeps_the_spend() -> None:
    now = [datetime(2026, 11, 29, 10, 59, tzinfo=UTC).timestamp()]
    limits = ApiKeyConfig(id="k", tenant="t", sha256="0" * 64,
                          budgets=(BudgetConfig(period="hour", cost=1.0),))
    quotas = Quotas([limits], clock=lambda: now[0])
    hold = quotas.reserve("k", tokens=5, cost=0.5)
    assert isinstance(hold, QuotaHold)
    quotas.settle(hold, tokens=5, cost=1.5)
    refusal = quotas.reserve("k", 5, 0.5)
    assert isinstance(refusal, Refusal) and refusal.retry_in_s == 60
    assert quotas.check("k") == refusal  # asked before the body: the same answer
    quotas.configure([limits.model_copy(update={"max_concurrent": 3})])
    assert isinstance(quotas.reserve("k", 5, 0.5), Refusal)  # same period: the spend is kept
    now[0] += 61  # the next hour
    assert isinstance(quotas.reserve("k", 5, 0.5), QuotaHold)
