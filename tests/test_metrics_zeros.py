"""Every series whose labels the config names is on /metrics at 0 before any request, and
follows reloads: a backend added shows its series at 0, a backend removed takes its series
away. The expected sets are derived from the config and the enums here."""

from __future__ import annotations

from typing import Any

from policies.clock.holds import HoldTimeModel
from policies.config import Config, Priority
from policies.health.failures import FailureKind, metric_kind
from policies.scheduler.admission import RejectReason
from policies.scheduler.pick import PickReason
from policies.slots.local import LocalSlotPool
from router.common.record import Phase
from router.config import config_from_dict
from router.reload import apply
from router.request.auth import AUTH_FAILURES
from router.telemetry.metrics import Metrics
from tests.support import MESSAGES, SdkClients, StartGateway, sim_backend
from tests.support.scrape import Samples, scrape
from tests.support.tenants import KEYS, with_tenants

STATUS = ("2xx", "4xx", "5xx")
FAST = {"ttft_s": 0, "tokens_per_s": 0, "output_tokens": 8, "max_num_seqs": 2}


def raw_config(extra: bool = False) -> dict[str, Any]:
    """A group of two replicas with a fallback of one, two tenants; `extra`: a third backend
    on a route of its own."""
    backends: dict[str, Any] = {
        "big": {"model": "m", "endpoints": [{"simulated": FAST, "slots": 2},
                                            {"simulated": FAST, "slots": 1}]},
        "small": sim_backend("s", slots=1)}
    routes: dict[str, Any] = {"chat": {"primary": "big", "fallbacks": ["small"],
                                       "overflow": "fallback"}}
    if extra:
        backends["extra"] = sim_backend("x", slots=1)
        routes["more"] = {"primary": "extra", "overflow": "reject"}
    return with_tenants({"backends": backends, "routes": routes})


def zeros(config: Config) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """The samples that must read 0 before any request, from `config` and the enums."""
    out: set[tuple[str, tuple[tuple[str, str], ...]]] = set()

    def add(name: str, **labels: str) -> None:
        out.add((name, tuple(sorted(labels.items()))))

    kinds = {k for k in map(metric_kind, FailureKind) if k is not None}
    tenants = [*(k.tenant for k in config.auth.keys), "other"]
    for reason in RejectReason:
        add("llm_rejection_total", backend="none", reason=reason.value)
    for code in AUTH_FAILURES:
        add("slotgate_auth_failures_total", code=code)
    for name, backend in config.backends.items():
        add("llm_queue_wait_time_seconds_count", backend=name)
        add("llm_slot_holding_time_seconds_count", backend=name)
        for reason in RejectReason:
            add("llm_rejection_total", backend=name, reason=reason.value)
        for kind in kinds:
            add("slotgate_upstream_errors_total", backend=name, kind=kind)
        for phase in Phase:
            if phase is not Phase.DONE:
                add("slotgate_client_disconnects_total", backend=name, phase=phase.value)
        for direction in ("in", "out"):
            add("slotgate_tokens_total", backend=name, direction=direction)
        for api in backend.served_apis:
            add("slotgate_ttft_seconds_count", backend=name, api=api.value)
        for priority in Priority:
            for family in ("slotgate_slo_attained_total", "slotgate_slo_missed_total"):
                add(family, backend=name, **{"class": priority.value})
            # Negative buckets: prometheus_client exposes no _count or _sum.
            add("slotgate_ttft_forecast_log_ratio_bucket", backend=name, le="+Inf",
                **{"class": priority.value})
        for tenant in tenants:
            add("slotgate_tenant_tokens_total", backend=name, tenant=tenant)
            add("slotgate_tenant_queue_wait_seconds_count", backend=name, tenant=tenant)
        replicas = backend.replicas(name)
        for replica in replicas:
            assert replica.name is not None
            add("slotgate_replica_ttft_seconds_count", backend=name, endpoint=replica.name)
            for status in STATUS:
                add("slotgate_replica_requests_total", backend=name, endpoint=replica.name,
                    status=status)
        if len(replicas) > 1:
            for pick in PickReason:
                add("slotgate_replica_picks_total", backend=name, reason=pick.value)
            for result in ("hit", "miss"):
                add("slotgate_prefix_lookups_total", backend=name, result=result)
    for route_name, route in config.routes.items():
        for target in (route.primary, *route.fallbacks):
            for api in config.backends[target].served_apis:
                for status in STATUS:
                    add("slotgate_requests_total", route=route_name, backend=target,
                        status_class=status, api=api.value)
    return out


def missing_zeros(samples: Samples, config: Config) -> list[Any]:
    return sorted(k for k in zeros(config) if samples.get(k) != 0.0)


def carrying(samples: Samples, label: str, value: str) -> list[Any]:
    return [k for k in samples if (label, value) in k[1]]


async def test_every_configured_series_reads_zero_before_any_request(
    start: StartGateway,
) -> None:
    raw = raw_config()
    gw = await start(raw)
    samples = await scrape(gw)
    assert missing_zeros(samples, config_from_dict(raw)) == []
    # Open sets appear on first use: no fallback has been taken yet.
    assert not [k for k in samples if k[0] == "slotgate_fallbacks_total"]


async def test_a_reload_adds_and_removes_a_backends_series(start: StartGateway) -> None:
    gw = await start(raw_config())
    assert carrying(await scrape(gw), "backend", "extra") == []
    grown = config_from_dict(raw_config(extra=True))
    await apply(gw.gateway, grown)
    samples = await scrape(gw)
    assert missing_zeros(samples, grown) == []
    assert samples[("slotgate_slot_capacity", (("backend", "extra"),))] == 1
    shrunk = config_from_dict(raw_config())
    await apply(gw.gateway, shrunk)
    samples = await scrape(gw)
    assert carrying(samples, "backend", "extra") == []  # its gauges and counters alike
    assert carrying(samples, "route", "more") == []
    assert missing_zeros(samples, shrunk) == []


async def test_a_backend_removed_then_added_again_counts_its_requests_again(
    start: StartGateway, sdk: SdkClients,
) -> None:
    """Its requests update the series its backend keeps (`Metrics.watch`): a removal takes
    them away, and a reload that brings the backend back hands it new ones."""
    gw = await start(raw_config(extra=True))
    await apply(gw.gateway, config_from_dict(raw_config()))
    assert carrying(await scrape(gw), "backend", "extra") == []
    await apply(gw.gateway, config_from_dict(raw_config(extra=True)))
    client = sdk(gw, api_key=KEYS["acme"])
    assert (await client.chat.completions.create(model="more", messages=MESSAGES)).choices
    samples = await scrape(gw)
    assert samples[("llm_slot_holding_time_seconds_count", (("backend", "extra"),))] == 1
    assert samples[("llm_queue_wait_time_seconds_count", (("backend", "extra"),))] == 0


async def test_a_reload_that_removes_a_replica_removes_its_counters(
    start: StartGateway,
) -> None:
    """A group made a group of one: the removed replica's counters go, and the group's
    pick series with it (a group of one has none)."""
    raw = raw_config()
    gw = await start(raw)
    del raw["backends"]["big"]["endpoints"][1]
    one = config_from_dict(raw)
    await apply(gw.gateway, one)
    samples = await scrape(gw)
    counted = ("_total", "_count", "_sum", "_bucket")  # not the gauges read from the pool
    assert [k for k in carrying(samples, "endpoint", "big-1") if k[0].endswith(counted)] == []
    assert not [k for k in samples if k[0] in ("slotgate_replica_picks_total",
                                               "slotgate_prefix_lookups_total")]
    assert missing_zeros(samples, one) == []


def test_cost_starts_at_zero_per_priced_backend_in_the_configs_currency() -> None:
    """Counted only with the ledger on, for backends with a price: a currency changed by a
    reload takes the old one's series away."""
    raw = raw_config()
    raw["backends"]["small"]["price"] = {"input_per_mtok": 1, "output_per_mtok": 2}
    raw["ledger"] = {"path": "unused.db"}  # configured, never opened here
    metrics = Metrics()
    for name, slots in (("big", 3), ("small", 1)):
        metrics.watch(LocalSlotPool(name, slots, 0, HoldTimeModel(1.0)))
    metrics.configure(config_from_dict(raw))
    assert metrics.cost.values == {("small", "USD"): 0.0}
    raw["currency"] = "EUR"
    metrics.configure(config_from_dict(raw))
    assert metrics.cost.values == {("small", "EUR"): 0.0}
