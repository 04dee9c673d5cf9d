"""Every Prometheus collector, in one place, on a registry owned by one gateway.

Label values come from the config (backend, route and tenant names) or from closed sets
(reasons, phases, status classes, client APIs), never from a request, so cardinality is
bounded.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from policies.config import AuthConfig, Priority
from policies.failures import FailureKind, metric_kind
from policies.pick import PickReason
from policies.slo import Verdict
from router.request.auth import AUTH_FAILURES
from router.telemetry.tallies import Spread, Tally

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from policies.slots import SlotPool
    from router.ledger.base import Ledger
    from router.record import RequestRecord

# LLM latencies: from a quick first token to a two-minute answer.
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
CLASSIFIER_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01)
# log2(actual / predicted TTFT): 0 is exact, 1 twice as late as forecast, -1 twice as soon.
FORECAST_BUCKETS = (-3.0, -2.0, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 2.0, 3.0)
_FORECAST_FLOOR_MS = 1.0  # both sides, so that a forecast of 0 has a finite ratio
OTHER_TENANT = "other"  # the tenant label of a request of no configured tenant

class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        # The five names of the original design, kept exactly. Slots held, queue depth
        # and capacity are read from the pools at scrape time (_PoolCollector), not set
        # at every change: a gauge update per acquire and release is hot-path work.
        self._pools: dict[str, SlotPool] = {}
        r.register(_PoolCollector(self._pools))
        self.queue_wait = Histogram("llm_queue_wait_time_seconds", "Time spent in a queue",
                                    ["backend"], buckets=BUCKETS, registry=r)
        # What every request updates is tallied in plain Python (router/telemetry/tallies.py).
        self.holding = Spread("llm_slot_holding_time_seconds", "Time a slot was held",
                              ["backend"], BUCKETS)
        self.rejections = Counter("llm_rejection", "Requests refused by the gateway",
                                  ["backend", "reason"], registry=r)
        # The rest, in Prometheus naming.
        self.requests = Tally("slotgate_requests", "Requests answered",
                              ["route", "backend", "status_class", "api"])
        self.fallbacks = Counter("slotgate_fallbacks", "Requests sent to a fallback",
                                 ["from", "to", "intent"], registry=r)
        self.classifier = Histogram("slotgate_classifier_seconds", "One intent prediction",
                                    buckets=CLASSIFIER_BUCKETS, registry=r)
        self.ttft = Spread("slotgate_ttft_seconds", "Time to the first byte of the answer",
                           ["backend", "api"], BUCKETS)
        self.upstream_errors = Counter("slotgate_upstream_errors", "Backend failures",
                                       ["backend", "kind"], registry=r)
        self.disconnects = Counter("slotgate_client_disconnects", "Clients that left early",
                                   ["backend", "phase"], registry=r)
        self.tokens = Tally("slotgate_tokens", "Tokens in and out", ["backend", "direction"])
        self.cost = Tally("slotgate_cost", "What answered requests cost, in the config's "
                          "currency", ["backend", "currency"])
        # Refusals by the key check: counted here (those of unknown callers are no ledger
        # rows and their access lines are sampled, so this is their exact count).
        self.auth_failures = Tally("slotgate_auth_failures", "Requests refused by the key "
                                   "check: no, wrong or duplicate key, or not an admin key",
                                   ["code"])
        # Each replica of a backend's group (`endpoint`: the replica's name, from the
        # config). Its slots and health are read at scrape time (_ReplicaCollector).
        r.register(_ReplicaCollector(self._pools))
        self.replica_requests = Tally("slotgate_replica_requests", "Requests a replica "
                                      "served", ["backend", "endpoint", "status"])
        self.replica_ttft = Spread("slotgate_replica_ttft_seconds", "Time to the first byte "
                                   "of the answer, per replica", ["backend", "endpoint"],
                                   BUCKETS)
        self.picks = Tally("slotgate_replica_picks", "Why a group's request was offered "
                           "its replica", ["backend", "reason"])
        self.prefix_lookups = Tally("slotgate_prefix_lookups", "A group's prompt prefixes "
                                    "looked up in its affinity table, by whether a replica "
                                    "was known to hold one", ["backend", "result"])
        # TTFT objectives (policies.slo): each request judged once, per backend and class.
        self.slo_attained = Tally("slotgate_slo_attained", "Requests whose first token came "
                                  "within their class's TTFT objective", ["backend", "class"])
        self.slo_missed = Tally("slotgate_slo_missed", "Requests whose first token came late, "
                                "or that ended without one", ["backend", "class"])
        self.forecast_error = Spread("slotgate_ttft_forecast_log_ratio", "log2 of a request's "
                                     "actual TTFT over the one predicted at its admission",
                                     ["backend", "class"], FORECAST_BUCKETS)
        # Each tenant's part of a backend (`tenant`: a configured key's tenant, else
        # OTHER_TENANT), counted as requests end; kept only when keys are configured.
        self.tenant_tokens = Tally("slotgate_tenant_tokens", "Tokens served to a tenant "
                                   "(prompt and completion)", ["backend", "tenant"])
        self.tenant_wait = Spread("slotgate_tenant_queue_wait_seconds", "Time a tenant's "
                                  "requests waited for a slot (0 when one was free)",
                                  ["backend", "tenant"], BUCKETS)
        self._tenants: frozenset[str] = frozenset()  # the label's values, OTHER_TENANT aside
        self._by_tenant = False  # any key configured
        self._groups: set[str] = set()  # the pools of more than one replica
        for tally in (self.holding, self.requests, self.ttft, self.tokens, self.cost,
                      self.auth_failures, self.replica_requests, self.replica_ttft,
                      self.picks, self.prefix_lookups, self.slo_attained, self.slo_missed,
                      self.forecast_error, self.tenant_tokens, self.tenant_wait):
            r.register(tally)

    def held(self, pool: str, seconds: float) -> None:
        self.holding.observe(self.holding.series((pool,)), seconds)

    def add_cost(self, backend: str, currency: str, amount: float) -> None:
        self.cost.add((backend, currency), amount)

    def watch_coordinator(self, healthy: Callable[[], bool]) -> None:
        Gauge("slotgate_redis_up", "1 while the shared pools' Redis answers (breaker closed)",
              registry=self.registry).set_function(lambda: 1.0 if healthy() else 0.0)

    def watch_ledger(self, ledger: Ledger) -> None:
        Gauge("slotgate_ledger_pending_rows", "Ledger rows not yet written",
              registry=self.registry).set_function(lambda: ledger.pending)
        self.registry.register(_LedgerCollector(ledger))

    def tenants(self, auth: AuthConfig) -> None:
        """The tenant label's values: the configured keys' tenants (auth on; with it off a
        request's tenant is a hash of its key: OTHER_TENANT), and OTHER_TENANT. Called at
        startup and on every reload; series of tenants no longer configured keep their
        counts."""
        self._by_tenant = bool(auth.keys)
        self._tenants = frozenset(k.tenant for k in auth.keys) if auth.enabled else frozenset()
        for pool in self._pools:
            self._tenant_zeros(pool)

    def _tenant_zeros(self, pool: str) -> None:
        if self._by_tenant:
            for tenant in (*self._tenants, OTHER_TENANT):
                self.tenant_tokens.add((pool, tenant), 0.0)

    def watch(self, pool: SlotPool) -> None:
        """Export the pool's series, zeros before its first request (again after a reload
        changed it: a backend may have become a group)."""
        self._pools[pool.name] = pool
        self.queue_wait.labels(pool.name)
        self.holding.series((pool.name,))
        self._groups.discard(pool.name)
        self._tenant_zeros(pool.name)
        for priority in Priority:
            self.slo_attained.add((pool.name, priority.value), 0.0)
            self.slo_missed.add((pool.name, priority.value), 0.0)
        if len(pool.seats()) > 1:
            self._groups.add(pool.name)
            for reason in PickReason:
                self.picks.add((pool.name, reason.value), 0.0)
            for result in ("hit", "miss"):
                self.prefix_lookups.add((pool.name, result), 0.0)

    def record(self, rec: RequestRecord, primary: str | None,
               failed: FailureKind | None = None) -> None:
        """Everything a finished request tells, from its record (`failed`: how its upstream
        exchange failed, if it did)."""
        backend = rec.backend or "none"
        if rec.status:
            self.requests.add((rec.route or "unknown", backend, f"{rec.status // 100}xx",
                               rec.api))
        if rec.error in AUTH_FAILURES:
            self.auth_failures.add((rec.error,))
        elif failed is not None and rec.backend and (kind := metric_kind(failed)) is not None:
            self.upstream_errors.labels(rec.backend, kind).inc()
        if rec.disconnect is not None and rec.backend:
            self.disconnects.labels(rec.backend, rec.disconnect.value).inc()
        if rec.reason and rec.reason.startswith("fallback:") and primary and rec.backend:
            intent = "overflow" if rec.reason == "fallback:overflow" else rec.intent or "unknown"
            self.fallbacks.labels(primary, rec.backend, intent).inc()
        if rec.backend is None:
            return
        if self._by_tenant:  # without keys, no request has a tenant: nothing to count
            self._tenant_share(rec, rec.backend)
        if rec.ttft_ms is not None:
            self.ttft.observe(self.ttft.series((rec.backend, rec.api)), rec.ttft_ms / 1000)
        if rec.prompt_tokens is not None:
            self.tokens.add((rec.backend, "in"), rec.prompt_tokens)
            self.tokens.add((rec.backend, "out"), rec.completion_tokens or 0)
        if rec.pick is not None and rec.backend in self._groups:  # a retry elsewhere may
            self.picks.add((rec.backend, rec.pick))  # leave its first group's pick behind
            if rec.prefix_blocks is not None:
                self.prefix_lookups.add((rec.backend, "hit" if rec.prefix_blocks else "miss"))
        if rec.replica is not None:
            if rec.status:
                self.replica_requests.add((rec.backend, rec.replica, f"{rec.status // 100}xx"))
            if rec.ttft_ms is not None:
                self.replica_ttft.observe(self.replica_ttft.series((rec.backend, rec.replica)),
                                          rec.ttft_ms / 1000)

    def tenant_label(self, tenant: str | None) -> str:
        """The tenant label of a request of `tenant`."""
        return tenant if tenant in self._tenants else OTHER_TENANT

    def _tenant_share(self, rec: RequestRecord, backend: str) -> None:
        """Its tokens, and its wait if it reached the line (got a slot, or waited and left)."""
        labels = (backend, self.tenant_label(rec.tenant))
        if rec.prompt_tokens is not None:
            self.tenant_tokens.add(labels, rec.prompt_tokens + (rec.completion_tokens or 0))
        if rec.slot_at is not None or rec.queue_wait_ms:
            self.tenant_wait.observe(self.tenant_wait.series(labels), rec.queue_wait_ms / 1000)

    def judged(self, rec: RequestRecord, verdict: Verdict) -> bool:
        """Count a request's verdict on its TTFT objective (and, with a first token, how far
        off its forecast was); returns whether it was attained. Its backend is the one that
        served it, else its route's primary (refused at admission)."""
        labels = (rec.backend or rec.primary or "none", rec.priority)
        attained = verdict is Verdict.ATTAINED
        (self.slo_attained if attained else self.slo_missed).add(labels)
        if rec.ttft_ms is not None and rec.predicted_ttft_ms is not None:
            ratio = (max(rec.ttft_ms, _FORECAST_FLOOR_MS)
                     / max(rec.predicted_ttft_ms, _FORECAST_FLOOR_MS))
            self.forecast_error.observe(self.forecast_error.series(labels), math.log2(ratio))
        return attained

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _PoolCollector(Collector):
    """Each pool's slots held, queue depth and capacity, as they are when scraped."""

    def __init__(self, pools: dict[str, SlotPool]) -> None:
        self.pools = pools

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = (
            (GaugeMetricFamily("llm_active_slots_gauge", "Slots held now",
                               labels=["backend"]), "active"),
            (GaugeMetricFamily("llm_queue_depth_gauge", "Requests waiting now",
                               labels=["backend"]), "queued"),
            (GaugeMetricFamily("slotgate_slot_capacity", "Slots configured",
                               labels=["backend"]), "capacity"),
        )
        for family, attribute in families:
            for name, pool in self.pools.items():
                family.add_metric([name], getattr(pool, attribute))
            yield family


class _ReplicaCollector(Collector):
    """Each replica's slots held, slots and health, as they are when scraped (an unhealthy
    replica's slots are outside its pool's capacity: 0)."""

    def __init__(self, pools: dict[str, SlotPool]) -> None:
        self.pools = pools

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["backend", "endpoint"]
        active = GaugeMetricFamily("slotgate_replica_active_slots",
                                   "Slots held now on the replica", labels=labels)
        capacity = GaugeMetricFamily("slotgate_replica_slot_capacity", "The replica's slots "
                                     "(0 while unhealthy)", labels=labels)
        healthy = GaugeMetricFamily("slotgate_replica_healthy", "1 while the replica's slots "
                                    "serve, 0 while it is out of its pool", labels=labels)
        for name, pool in self.pools.items():
            for seats in pool.seats():
                active.add_metric([name, seats.name], seats.active)
                capacity.add_metric([name, seats.name], seats.slots if seats.healthy else 0)
                healthy.add_metric([name, seats.name], 1.0 if seats.healthy else 0.0)
        yield from (active, capacity, healthy)


class _LedgerCollector(Collector):
    """The ledger writer's own counts, read at scrape time."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def collect(self) -> Iterator[CounterMetricFamily]:
        rows = CounterMetricFamily("slotgate_ledger_rows", "Ledger rows by what became of them",
                                   labels=["result"])
        rows.add_metric(["written"], self.ledger.written)
        rows.add_metric(["dropped"], self.ledger.dropped)
        yield rows
        yield CounterMetricFamily("slotgate_ledger_write_failures",
                                  "Failed ledger batch writes (retried)",
                                  value=self.ledger.failures)
