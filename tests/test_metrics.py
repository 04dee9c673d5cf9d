"""/metrics through ten users and three slots and through a group of replicas, and the
per-request log line."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from policies.clock.holds import HoldTimeModel
from policies.scheduler.pick import PickReason
from policies.slots.local import LocalSlotPool
from router.common.record import RequestRecord
from router.config import config_from_dict
from router.telemetry.metrics import Metrics
from router.telemetry.tallies import Spread
from tests.support import (
    SdkClients,
    StartGateway,
    assert_idle,
    engine,
    gateway_config,
    send_in_order,
    sim_backend,
)
from tests.support.scrape import scrape, value


async def test_metrics_follow_ten_users_on_three_slots(
    start: StartGateway, sdk: SdkClients
) -> None:
    gw = await start(gateway_config(sim_backend("big-70b", slots=3, queue_limit=5)))
    before = await scrape(gw)
    assert value(before, "slotgate_slot_capacity", backend="big") == 3
    assert value(before, "llm_active_slots_gauge", backend="big") == 0
    sim = engine(gw)
    sim.hold()
    tasks, rejected = await send_in_order(sdk(gw), gw, 10)
    busy = await scrape(gw)
    assert value(busy, "llm_active_slots_gauge", backend="big") == 3
    assert value(busy, "llm_queue_depth_gauge", backend="big") == 5
    assert value(busy, "llm_rejection_total", backend="big", reason="queue_full") == 2
    assert len(rejected) == 2
    sim.release()
    await asyncio.gather(*tasks[:8])
    await assert_idle(gw)
    after = await scrape(gw)
    assert value(after, "llm_active_slots_gauge", backend="big") == 0
    assert value(after, "llm_queue_depth_gauge", backend="big") == 0
    assert value(after, "llm_queue_wait_time_seconds_count", backend="big") == 5
    assert value(after, "llm_slot_holding_time_seconds_count", backend="big") == 8
    assert value(after, "slotgate_requests_total", route="chat", backend="big",
                 status_class="2xx", api="chat") == 8
    assert value(after, "slotgate_requests_total", route="chat", backend="none",
                 status_class="4xx", api="chat") == 2
    assert value(after, "slotgate_tokens_total", backend="big", direction="out") == 8 * 8
    assert value(after, "slotgate_ttft_seconds_count", backend="big", api="chat") == 8


async def test_replicas_are_counted_per_endpoint_and_picks_start_at_zero(
    start: StartGateway, sdk: SdkClients
) -> None:
    fast = {"ttft_s": 0, "tokens_per_s": 0, "output_tokens": 8, "max_num_seqs": 8}
    gw = await start({
        "backends": {"big": {"model": "m", "pick": "least_loaded",
                             "endpoints": [{"simulated": fast, "slots": 2},
                                           {"simulated": fast, "slots": 1}]},
                     "one": {"model": "m", "slots": 1, "simulated": fast}},
        "routes": {"chat": {"primary": "big", "overflow": "reject"}}})
    before = await scrape(gw)
    for reason in PickReason:  # every reason exported for the group before any request
        assert ("slotgate_replica_picks_total",
                (("backend", "big"), ("reason", reason.value))) in before
    assert not any(name == "slotgate_replica_picks_total" and ("backend", "one") in labels
                   for name, labels in before)  # a group of one is never picked within
    for result in ("hit", "miss"):
        assert value(before, "slotgate_prefix_lookups_total", backend="big", result=result) == 0
        assert ("slotgate_prefix_lookups_total", (("backend", "big"), ("result", result))) \
            in before
    for endpoint, slots in (("big-0", 2), ("big-1", 1)):
        assert value(before, "slotgate_replica_slot_capacity", backend="big",
                     endpoint=endpoint) == slots
        assert value(before, "slotgate_replica_healthy", backend="big", endpoint=endpoint) == 1
    assert value(before, "slotgate_replica_slot_capacity", backend="one", endpoint="one") == 1
    engines = [engine(gw, "big", name) for name in ("big-0", "big-1")]
    for sim in engines:
        sim.hold()
    tasks, rejected = await send_in_order(sdk(gw), gw, 3)
    assert rejected == []
    busy = await scrape(gw)
    assert value(busy, "slotgate_replica_active_slots", backend="big", endpoint="big-0") == 2
    assert value(busy, "slotgate_replica_active_slots", backend="big", endpoint="big-1") == 1
    for sim in engines:
        sim.release()
    await asyncio.gather(*tasks)
    await assert_idle(gw)
    pool = gw.gateway.backends["big"].pool
    pool.set_healthy("big-1", False)
    after = await scrape(gw)
    pool.set_healthy("big-1", True)
    for endpoint, served in (("big-0", 2), ("big-1", 1)):
        assert value(after, "slotgate_replica_requests_total", backend="big",
                     endpoint=endpoint, status="2xx") == served
        assert value(after, "slotgate_replica_ttft_seconds_count", backend="big",
                     endpoint=endpoint) == served
        assert value(after, "slotgate_replica_active_slots", backend="big",
                     endpoint=endpoint) == 0
    assert value(after, "slotgate_replica_healthy", backend="big", endpoint="big-1") == 0
    assert value(after, "slotgate_replica_slot_capacity", backend="big", endpoint="big-1") == 0
    assert sum(v for (name, labels), v in after.items()
               if name == "slotgate_replica_picks_total" and ("backend", "big") in labels) == 3
    assert value(after, "slotgate_replica_picks_total", backend="big",
                 reason="least_loaded") == 3


async def test_log_line_is_json_without_content(
    start: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await start(gateway_config(sim_backend("m", slots=1)))
    secret = "my very private prompt 12345"
    with caplog.at_level(logging.INFO, logger="slotgate.access"):
        async with aiohttp.ClientSession() as http:
            async with http.post(gw.url + "/v1/chat/completions", json={
                    "model": "chat", "messages": [{"role": "user", "content": secret}]}) as r:
                answer = await r.json()
    line = next(rec.getMessage() for rec in caplog.records if rec.name == "slotgate.access")
    entry = orjson.loads(line)
    for field in ("request_id", "route", "backend", "reason", "queue_wait_ms", "ttft_ms",
                  "total_ms", "prompt_tokens", "completion_tokens", "status", "disconnect"):
        assert field in entry
    assert entry["status"] == 200 and entry["backend"] == "big"
    assert secret not in line
    assert answer["choices"][0]["message"]["content"] not in line
    await assert_idle(gw)


async def test_content_logging_is_opt_in(
    start: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    raw = gateway_config(sim_backend("m", slots=1))
    raw["logging"] = {"content": True}
    gw = await start(raw)
    with caplog.at_level(logging.INFO, logger="slotgate.access"):
        async with aiohttp.ClientSession() as http:
            async with http.post(gw.url + "/v1/chat/completions", json={
                    "model": "chat", "messages": [{"role": "user", "content": "hello 42"}]}) as r:
                assert r.status == 200
    line = next(rec.getMessage() for rec in caplog.records if rec.name == "slotgate.access")
    assert orjson.loads(line)["prompt"] == "hello 42"
    await assert_idle(gw)


def test_a_backend_that_becomes_a_group_gets_its_pick_series() -> None:
    """A reload may turn a group of one into a group: configured again, its reasons show at 0;
    a group's pick left on a record that ended on a group of one is not counted there."""
    metrics = Metrics()
    config = config_from_dict(gateway_config(sim_backend("m", slots=1)))
    pool = LocalSlotPool("big", 1, 0, HoldTimeModel(1.0))
    metrics.watch(pool)
    metrics.configure(config)
    assert metrics.picks.values == {}
    pool.resize(3, 0, {"big-0": 1, "big-1": 2})
    metrics.watch(pool)
    metrics.configure(config)
    assert metrics.picks.values == {("big", r.value): 0.0 for r in PickReason}
    rec = RequestRecord("r", "/v1/chat/completions", 0.0, 0.0, "row", backend="small",
                        replica="small", pick="prefix", status=200)
    metrics.record(rec, "big")
    assert set(metrics.picks.values) == {("big", r.value) for r in PickReason}
    assert metrics.replica_requests.values[("small", "small", "2xx")] == 1.0


def test_tallied_histogram_buckets_are_inclusive_and_cumulative() -> None:
    """The plain-Python histogram (router/telemetry/tallies.py) exposes what prometheus_client's
    would: `le` bounds inclusive, cumulative counts, +Inf equal to the count."""
    registry = CollectorRegistry()
    spread = Spread("t_seconds", "test", ["backend"], (0.01, 0.1))
    registry.register(spread)
    series = spread.series(("b",))
    for seconds in (0.01, 0.0100001, 0.1, 5.0):
        spread.observe(series, seconds)
    samples = {(s.name, s.labels.get("le")): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode())
               for s in f.samples}
    assert samples[("t_seconds_bucket", "0.01")] == 1
    assert samples[("t_seconds_bucket", "0.1")] == 3
    assert samples[("t_seconds_bucket", "+Inf")] == samples[("t_seconds_count", None)] == 4
    assert samples[("t_seconds_sum", None)] == pytest.approx(5.1200001)


def _counted_by_labels(records: list[RequestRecord], tenants: frozenset[str]
                       ) -> dict[str, dict[tuple[str, ...], float]]:
    """What the served series should hold, counted label by label."""
    want: dict[str, dict[tuple[str, ...], float]] = {}

    def add(family: str, labels: tuple[str, ...], amount: float = 1.0) -> None:
        got = want.setdefault(family, {})
        got[labels] = got.get(labels, 0.0) + amount

    for rec in records:
        assert rec.backend is not None
        status = f"{rec.status // 100}xx"
        tenant = rec.tenant if rec.tenant in tenants else "other"
        if rec.status:
            add("requests", (rec.route or "unknown", rec.backend, status, rec.api))
            if rec.replica is not None:
                add("replica_requests", (rec.backend, rec.replica, status))
        if rec.prompt_tokens is not None:
            add("tokens", (rec.backend, "in"), rec.prompt_tokens)
            add("tokens", (rec.backend, "out"), rec.completion_tokens or 0)
            add("tenant_tokens", (rec.backend, tenant),
                rec.prompt_tokens + (rec.completion_tokens or 0))
    return want


def test_a_kinds_kept_series_count_what_label_by_label_counting_would() -> None:
    """router/telemetry/served.py: requests of every kind (status, replica, tenant, tokens
    or none, a route or none), some kinds again and again, and a reload between them that
    removes a backend's series and brings them back: each count as if made label by label."""
    raw = gateway_config(sim_backend("m", slots=2))
    raw["auth"] = {"enabled": True, "keys": [{"id": "k", "tenant": "acme", "sha256": "0" * 64}]}
    config = config_from_dict(raw)
    metrics, pool = Metrics(), LocalSlotPool("big", 2, 0, HoldTimeModel(1.0))
    metrics.watch(pool)
    metrics.configure(config)
    kinds: list[dict[str, Any]] = [dict(status=200, replica="big", tenant="acme", prompt_tokens=5,
                  completion_tokens=7, ttft_ms=12.0),
             dict(status=200, replica=None, tenant="stranger", prompt_tokens=3,
                  completion_tokens=None),
             dict(status=502, replica="big", tenant=None, prompt_tokens=None),
             dict(status=0, replica="big", tenant="acme", prompt_tokens=2, completion_tokens=1),
             dict(status=200, replica="big", tenant="acme", prompt_tokens=1,
                  completion_tokens=1, route=None)]
    records = [RequestRecord("r", "/v1/chat/completions", 0.0, 0.0, "row", backend="big",
                             reason="primary", **{"route": "chat", **kind})
               for _ in range(3) for kind in kinds]
    for rec in records[:8]:
        metrics.record(rec, "big")
    other = {"backends": {"other": sim_backend("m", slots=1)},
             "routes": {"chat": {"primary": "other"}}}
    metrics.watch(LocalSlotPool("other", 1, 0, HoldTimeModel(1.0)))
    metrics.configure(config_from_dict(other))
    assert metrics.tokens.values == {("other", "in"): 0.0, ("other", "out"): 0.0}
    metrics.watch(pool)
    metrics.configure(config)  # back: its series at 0 again, the first eight gone
    for rec in records[8:]:
        metrics.record(rec, "big")
    want = _counted_by_labels(records[8:], frozenset({"acme"}))
    for family, series in want.items():
        values = getattr(metrics, family).values
        assert {k: values.get(k) for k in series} == series, family
    ttft = metrics.ttft.series(("big", "chat"))
    assert ttft[-1] == pytest.approx(0.012 * sum(1 for r in records[8:] if r.ttft_ms))
