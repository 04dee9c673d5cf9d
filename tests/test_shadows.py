"""Shadow comparisons through a real gateway on simulated engines: a request the route
moved to its small model is replayed on the primary in an idle slot and judged in both
orders; the simulated judge prefers the longer answer (router.upstream.simulated.judge),
so each verdict is known. A shadow never takes a slot a real request waits for, gives its
slot back to one at once, and never reaches the client."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from policies.quality.judging import Verdict
from router.app import RunningGateway
from router.quality.shadows import ShadowRunner
from router.quality.verdicts import fetch
from tests.support import (
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    poll_until,
    sim_backend,
)

SIMPLE: Any = [{"role": "user", "content": "hi there"}]
LONG = 24  # the primary's answers, in words
SHORT = 8  # the small model's


def config(tmp_path: Path, small_words: int = SHORT, slots: int = 2,
           **quality: Any) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=slots, queue_limit=4,
                                     sim={"output_tokens": LONG}),
                         sim_backend("s", slots=2, queue_limit=4,
                                     sim={"output_tokens": small_words}))
    raw["routes"]["chat"] |= {"overflow": "fallback", "quality": {"shadow_rate": 1.0},
                              "fallback": {"when": "always", "min_confidence": 0.0}}
    raw["routes"]["direct"] = {"primary": "big"}  # interactive work on the primary alone
    raw["ledger"] = {"path": str(tmp_path / "ledger.sqlite3"), "flush_interval_s": 0.05}
    raw["quality"] = quality
    return raw


def shadows(gw: RunningGateway) -> ShadowRunner:
    runner = gw.gateway.shadows
    assert runner is not None
    return runner


async def judged(gw: RunningGateway, count: int = 1) -> None:
    runner = shadows(gw)
    await poll_until(lambda: sum(n for k, n in runner.counts.items()
                                 if k.startswith("verdict:")) >= count and not runner.busy)


async def test_a_downgraded_request_is_replayed_and_judged_in_both_orders(
        sdk: SdkClients, start: StartGateway, tmp_path: Path) -> None:
    gw = await start(config(tmp_path))
    client = sdk(gw)
    asked = await client.chat.completions.with_raw_response.create(
        model="chat", messages=SIMPLE, max_tokens=64)
    assert asked.headers["x-slotgate-backend"] == "small"
    assert len(str(asked.parse().choices[0].message.content).split()) == SHORT  # the client's
    await judged(gw)
    assert shadows(gw).counts["verdict:worse"] == 1  # the primary's answer is longer
    big = engine(gw).stats()
    assert big["requests"] == 3 and big["completed"] == 3  # the replay and two judgements
    assert engine(gw, "small").stats()["requests"] == 1
    ledger = gw.gateway.ledger
    assert ledger is not None
    [verdict] = await fetch(ledger.store, None, None)
    assert (verdict.route, verdict.verdict, verdict.language) == ("chat", Verdict.WORSE, "en")
    assert verdict.intent is not None and verdict.p_simple is not None
    assert verdict.prompt_tokens > 0
    scraped = generate_latest(gw.gateway.metrics.registry).decode()
    for series in ('slotgate_shadows_total{outcome="kept"} 1.0',
                   'slotgate_shadows_total{outcome="cut"} 0.0',
                   'slotgate_shadow_verdicts_total{verdict="worse"} 1.0',
                   'slotgate_shadow_verdicts_total{verdict="tie"} 0.0',
                   "slotgate_shadows_waiting 0.0"):
        assert series in scraped
    await assert_idle(gw)


async def test_answers_of_about_one_length_tie(sdk: SdkClients, start: StartGateway,
                                               tmp_path: Path) -> None:
    gw = await start(config(tmp_path, small_words=LONG))
    await sdk(gw).chat.completions.create(model="chat", messages=SIMPLE, max_tokens=64)
    await judged(gw)
    assert shadows(gw).counts["verdict:tie"] == 1
    await assert_idle(gw)


async def test_a_shadow_waits_behind_every_real_request(sdk: SdkClients, start: StartGateway,
                                                        tmp_path: Path) -> None:
    gw = await start(config(tmp_path, slots=1))
    client, big = sdk(gw), engine(gw)
    big.hold()
    held = asyncio.create_task(client.chat.completions.create(
        model="direct", messages=SIMPLE, extra_headers={"x-request-id": "held"}))
    await big.wait_until(lambda e: e.active == 1)
    queued = asyncio.create_task(client.chat.completions.create(
        model="direct", messages=SIMPLE, extra_headers={"x-request-id": "queued"}))
    await poll_until(lambda: gw.gateway.backends["big"].pool.queued == 1)
    await client.chat.completions.create(model="chat", messages=SIMPLE, max_tokens=64)
    assert len(shadows(gw).pending) == 1  # kept, waiting for an idle primary slot
    big.release()
    await asyncio.gather(held, queued)
    await judged(gw)
    order = list(big.records)
    assert order[:2] == ["held", "queued"] and len(order) == 5  # then the shadow's three
    await assert_idle(gw)


async def test_a_real_request_takes_a_shadows_slot(sdk: SdkClients, start: StartGateway,
                                                   tmp_path: Path) -> None:
    gw = await start(config(tmp_path, slots=1))
    client, big = sdk(gw), engine(gw)
    big.hold()
    await client.chat.completions.create(model="chat", messages=SIMPLE, max_tokens=64)
    await big.wait_until(lambda e: e.active == 1)  # the replay holds the only slot
    real = asyncio.create_task(client.chat.completions.create(
        model="direct", messages=SIMPLE, extra_headers={"x-request-id": "real"}))
    await big.wait_until(lambda e: e.stats()["aborted"] == 1 and "real" in e.records)
    big.release()
    await real
    await judged(gw)
    assert shadows(gw).counts["cut"] == 1 and shadows(gw).counts["verdict:worse"] == 1
    await assert_idle(gw)


async def test_shadows_keep_to_their_bounds(sdk: SdkClients, start: StartGateway,
                                            tmp_path: Path) -> None:
    gw = await start(config(tmp_path, opt_out_tenants=["anonymous"], max_tokens_per_hour=0))
    client = sdk(gw)
    await client.chat.completions.create(model="chat", messages=SIMPLE, max_tokens=64)
    counts = shadows(gw).counts
    assert counts["kept"] == 0 and counts["skipped:tokens_per_hour"] == 1
    assert engine(gw).stats()["requests"] == 0
    await assert_idle(gw)


async def test_a_gateway_that_stops_cuts_its_shadow_calls(sdk: SdkClients, start: StartGateway,
                                                          tmp_path: Path) -> None:
    gw = await start(config(tmp_path, slots=1))
    big = engine(gw)
    big.hold()
    await sdk(gw).chat.completions.create(model="chat", messages=SIMPLE, max_tokens=64)
    await big.wait_until(lambda e: e.active == 1)  # the replay holds the slot
    runner = shadows(gw)
    await gw.close()
    await big.wait_until(lambda e: e.active == 0 and e.stats()["aborted"] == 1)
    assert not runner.running and runner.counts["verdict:worse"] == 0


async def test_texts_are_kept_only_when_asked(sdk: SdkClients, start: StartGateway,
                                              tmp_path: Path) -> None:
    for keep in (False, True):
        folder = tmp_path / str(keep)
        folder.mkdir()
        gw = await start(config(folder, keep_texts=keep))
        await sdk(gw).chat.completions.create(model="chat", messages=SIMPLE, max_tokens=64)
        await judged(gw)
        ledger = gw.gateway.ledger
        assert ledger is not None
        kept = await ledger.store.run("SELECT question, small_answer, primary_answer "
                                      "FROM verdict_texts")
        if not keep:
            assert kept == []
            continue
        [(question, small, primary)] = kept
        assert question == "hi there"
        assert (len(str(small).split()), len(str(primary).split())) == (SHORT, LONG)
        await assert_idle(gw)
