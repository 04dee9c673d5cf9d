"""Batch lines in the ledger, through a real gateway on SQLite and the real PostgreSQL: each
line's row says it was a batch line and costs its backend's price less `batch_discount`
(per token or per slot-second), where an interactive request of the same key pays the
whole price; the key's budget counts the lines' tokens."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import openai
import pytest

from policies.pricing.costs import slot_second_price
from router.config import config_from_dict
from router.report.build import build_report
from tests.support import (
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    poll_until,
    rows_of,
    sim_backend,
)
from tests.support.batch_jobs import ended, jsonl, line, submit

KEY = "sk-alice-0123456789"
PRICES = {"tokens": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
          "gpu": {"gpu_hour": 7.2, "gpus": 1}}
DISCOUNT = 0.25


def config(target: str, tmp_path: Path, price: dict[str, Any],
           **key: Any) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=2, queue_limit=4, price=price))
    raw["ledger"] = {"url" if target.startswith("postgres") else "path": target,
                     "flush_interval_s": 0.05}
    raw["batch"] = {"files_dir": str(tmp_path / "files")}
    raw["auth"] = {"enabled": True, "keys": [
        {"id": "alice", "tenant": "alice", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
         **key}]}
    return raw


@pytest.mark.parametrize("kind", sorted(PRICES))
async def test_a_batch_lines_row_is_marked_and_costs_its_price_less_the_discount(
        sdk: SdkClients, start: StartGateway, ledger_target: str, tmp_path: Path,
        kind: str) -> None:
    raw = config(ledger_target, tmp_path, {**PRICES[kind], "batch_discount": DISCOUNT})
    price = config_from_dict(raw).backends["big"].price
    assert price is not None
    gw = await start(raw)
    alice = sdk(gw, api_key=KEY)
    asked = await alice.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi q0"}], max_tokens=4)
    assert asked.usage is not None
    job = await submit(alice, jsonl(*(line(f"q{i}") for i in range(3))))
    assert (await ended(alice, job.id)).status == "completed"
    await assert_idle(gw)
    rows = [r for r in await rows_of(gw, ledger_target) if r.route == "chat"]
    marks = [r.batch for r in rows]
    assert (marks.count(True), marks.count(False), len(marks)) == (3, 1, 4)
    for r in rows:
        if kind == "tokens":
            whole = (r.prompt_tokens * 3.0 + r.completion_tokens * 15.0) / 1e6
        else:
            whole = r.slot_ms / 1000 * slot_second_price(price, 2)
        assert whole > 0
        assert r.cost == pytest.approx(whole * (1 - DISCOUNT) if r.batch else whole)
        assert r.counterfactual_cost == r.cost  # on the primary, as every line runs
        assert (r.status, r.tenant, r.key_id) == (200, "alice", "alice")
        assert r.priority == ("sheddable" if r.batch else "standard")
    lines = [r for r in rows if r.batch]
    report = build_report(rows, slots={"big": 2}, resamples=10)["batch"]
    (alice,) = report["tenants"]
    assert alice["batch"] == {"requests": 3, "cost": pytest.approx(sum(r.cost for r in lines)),
                              "tokens": sum(r.prompt_tokens + r.completion_tokens
                                            for r in lines)}
    assert report["backends"][0]["batch_slot_s"] == pytest.approx(
        sum(r.slot_ms for r in lines) / 1000)
    if kind == "tokens":  # the same prompt and answer, at three quarters of the price
        (interactive,) = [r for r in rows if not r.batch]
        same = [r for r in rows if r.batch and (r.prompt_tokens, r.completion_tokens)
                == (interactive.prompt_tokens, interactive.completion_tokens)]
        assert same and same[0].cost == pytest.approx(interactive.cost * (1 - DISCOUNT))


async def test_the_keys_budget_counts_its_batch_lines_tokens(
        sdk: SdkClients, start: StartGateway, tmp_path: Path) -> None:
    """A line is admitted under the key's budget as a live request is, and charged: after
    one line the key is past a budget of one token, and its next request is refused."""
    target = str(tmp_path / "ledger.sqlite3")
    gw = await start(config(target, tmp_path, PRICES["tokens"],
                            budgets=[{"period": "day", "tokens": 1}]))
    alice = sdk(gw, api_key=KEY)
    job = await submit(alice, jsonl(line("q0")))
    done = await ended(alice, job.id)
    assert (done.status, done.request_counts.completed) == ("completed", 1)
    with pytest.raises(openai.RateLimitError) as refused:
        await alice.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert refused.value.body["code"] == "budget_exceeded"  # type: ignore[index]
    await assert_idle(gw)
    rows = await rows_of(gw, target)
    assert [(r.batch, r.status) for r in rows] == [(True, 200), (False, 429)]


async def test_a_line_refused_by_its_keys_budget_pauses_its_job(
        sdk: SdkClients, start: StartGateway, tmp_path: Path) -> None:
    """The key's budget runs out after the first line: the second is refused (429
    budget_exceeded) and its job waits the Retry-After before it sends a line again, instead
    of sending it back at once, turn after turn."""
    target = str(tmp_path / "ledger.sqlite3")
    gw = await start(config(target, tmp_path, PRICES["tokens"],
                            budgets=[{"period": "day", "tokens": 1}]))
    alice = sdk(gw, api_key=KEY)
    job = await submit(alice, jsonl(line("q0"), line("q1")))
    runner = gw.gateway.batch_runner
    assert runner is not None
    await poll_until(lambda: job.id in runner.paused)
    for _ in range(5):  # turns of the runner while the job is paused: none sends q1
        await runner._turn()
    assert sum(n for (_, outcome), n in runner.outcomes.items() if outcome == "requeued") == 1
    assert engine(gw).stats()["requests"] == 1
    await alice.batches.cancel(job.id)
    done = await ended(alice, job.id)
    assert (done.status, done.request_counts.completed, done.request_counts.failed) == (
        "cancelled", 1, 1)  # q1 never ran: batch_cancelled in the error file
    await assert_idle(gw)
