"""Every Prometheus collector, in one place, on a registry owned by one gateway.

Label values come from the config (backend, route and tenant names) or from closed sets
(reasons, phases, status classes, client APIs), never from a request, so cardinality is
bounded. Those known from the config start at 0 (`configure`, router/telemetry/zeros.py);
the rest appear on first use: the fallbacks' intents (the classifier's labels) and the
routes' requests on a backend outside the route's primary and fallbacks (an A/B arm's).
"""

from __future__ import annotations

import math
from itertools import product
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from policies.clock.slo import Verdict
from policies.config import Config, Priority
from policies.health.failures import METRIC_KINDS, FailureKind, metric_kind
from policies.scheduler.admission import RejectReason, RouteReason
from policies.scheduler.pick import PickReason
from router.common.record import Phase
from router.request.auth import AUTH_FAILURES
from router.telemetry.scraped import LedgerCollector, PoolCollector, ReplicaCollector
from router.telemetry.served import MAX_KINDS, Families, Kind, Served
from router.telemetry.tallies import Labels, Spread, Tally
from router.telemetry.zeros import STATUS_CLASSES, Labelled, Scope, rescope

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from prometheus_client.metrics_core import Metric

    from policies.slots import SlotPool
    from router.common.record import RequestRecord
    from router.ledger.base import Ledger

# LLM latencies: from a quick first token to a two-minute answer.
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
CLASSIFIER_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01)
STALL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# log2(actual / predicted TTFT): 0 is exact, 1 twice as late as forecast, -1 twice as soon.
FORECAST_BUCKETS = (-3.0, -2.0, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.0, 2.0, 3.0)
_FORECAST_FLOOR_MS = 1.0  # both sides, so that a forecast of 0 has a finite ratio
OTHER_TENANT = "other"  # the tenant label of a request of no configured tenant
NO_BACKEND = "none"  # the backend label of a request refused before it had one
_CLASSES = tuple(p.value for p in Priority)
_REASONS = tuple(r.value for r in RejectReason)
_PICKS = tuple(r.value for r in PickReason)
_PHASES = tuple(p.value for p in Phase if p is not Phase.DONE)  # where a client may leave
_PRIMARY = RouteReason.PRIMARY.value  # the reason of a request that ran on its primary

class Metrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        # The five names of the original design, kept exactly. Slots held, queue depth
        # and capacity are read from the pools at scrape time (PoolCollector), not set
        # at every change: a gauge update per acquire and release is hot-path work.
        self._pools: dict[str, SlotPool] = {}
        r.register(PoolCollector(self._pools))
        self.queue_wait = Histogram("llm_queue_wait_time_seconds", "Time spent in a queue",
                                    ["backend"], buckets=BUCKETS, registry=r)
        # What every request updates is tallied in plain Python (router/telemetry/tallies.py).
        self.holding = Spread("llm_slot_holding_time_seconds", "Time a slot was held",
                              ["backend"], BUCKETS)
        self.rejections = Tally("llm_rejection", "Requests refused by the gateway",
                                ["backend", "reason"])
        # The rest, in Prometheus naming.
        self.requests = Tally("slotgate_requests", "Requests answered",
                              ["route", "backend", "status_class", "api"])
        self.fallbacks = Tally("slotgate_fallbacks", "Requests sent to a fallback",
                               ["from", "to", "intent"])
        self.classifier = Histogram("slotgate_classifier_seconds", "One intent prediction",
                                    buckets=CLASSIFIER_BUCKETS, registry=r)
        self.loop_stalls = Histogram(
            "slotgate_event_loop_stall_seconds", "Stalls of the event loop (a timer every "
            "20 ms ran this much late, past 5 ms): time no other client was served",
            buckets=STALL_BUCKETS, registry=r)
        self.ttft = Spread("slotgate_ttft_seconds", "Time to the first byte of the answer",
                           ["backend", "api"], BUCKETS)
        self.engine_usage_rejected = Tally(
            "slotgate_engine_usage_rejected", "Answers whose engine-reported usage was out of "
            "bounds (negative, or beyond the prompt and max_tokens): estimated instead",
            ["backend"])
        self.upstream_errors = Tally("slotgate_upstream_errors", "Backend failures",
                                     ["backend", "kind"])
        self.disconnects = Tally("slotgate_client_disconnects", "Clients that left early",
                                 ["backend", "phase"])
        self.tokens = Tally("slotgate_tokens", "Tokens in and out", ["backend", "direction"])
        self.cost = Tally("slotgate_cost", "What answered requests cost, in the config's "
                          "currency", ["backend", "currency"])
        # Refusals by the key check: counted here (those of unknown callers are no ledger
        # rows and their access lines are sampled, so this is their exact count).
        self.auth_failures = Tally("slotgate_auth_failures", "Requests refused by the key "
                                   "check: no, wrong or duplicate key, or not an admin key",
                                   ["code"])
        # Each replica of a backend's group (`endpoint`: the replica's name, from the
        # config). Its slots and health are read at scrape time (ReplicaCollector).
        r.register(ReplicaCollector(self._pools))
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
        # TTFT objectives (policies.clock.slo): each request judged once, per backend and class.
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
        self._scope = Scope()  # the label values of the last configure
        self._labelled = self._zeros()
        self._families = Families(self.requests, self.ttft, self.tokens, self.replica_requests,
                                  self.replica_ttft, self.tenant_tokens, self.tenant_wait)
        self._kinds: dict[Kind, Served] = {}  # (router/telemetry/served.py)
        for labelled in self._labelled:
            r.register(labelled.family)
        r.register(self.fallbacks)  # its intents are the classifier's: on first use

    def _zeros(self) -> list[Labelled]:
        """Each family's labels, and its series at 0 in a scope: a backend's with each
        value of a closed set; a group's with each of its replicas."""
        def each(backends: tuple[str, ...], values: tuple[str, ...]) -> product[Labels]:
            return product(backends, values)

        def per_replica(s: Scope) -> list[Labels]:
            return [(b, e) for b, names in s.replicas.items() for e in names]

        return [
            Labelled(self.holding, ("backend",), lambda s: ((b,) for b in s.backends)),
            Labelled(self.rejections, ("backend", ""), lambda s: each(
                (*s.backends, NO_BACKEND), _REASONS)),
            Labelled(self.requests, ("route", "backend", "", ""), lambda s: (
                (route, b, status, api) for route, targets in s.routes.items()
                for b in targets for status in STATUS_CLASSES for api in s.apis[b])),
            Labelled(self.ttft, ("backend", ""), lambda s: (
                (b, api) for b in s.backends for api in s.apis[b])),
            Labelled(self.upstream_errors, ("backend", ""),
                     lambda s: each(s.backends, METRIC_KINDS)),
            Labelled(self.engine_usage_rejected, ("backend",),
                     lambda s: ((b,) for b in s.backends)),
            Labelled(self.disconnects, ("backend", ""), lambda s: each(s.backends, _PHASES)),
            Labelled(self.tokens, ("backend", ""), lambda s: each(s.backends, ("in", "out"))),
            Labelled(self.cost, ("backend", "currency"), lambda s: each(s.priced, (s.currency,))),
            Labelled(self.auth_failures, ("",), lambda s: ((c,) for c in AUTH_FAILURES)),
            Labelled(self.replica_requests, ("backend", "endpoint", ""), lambda s: (
                (*replica, status) for replica in per_replica(s) for status in STATUS_CLASSES)),
            Labelled(self.replica_ttft, ("backend", "endpoint"), per_replica),
            Labelled(self.picks, ("group", ""), lambda s: each(s.groups, _PICKS)),
            Labelled(self.prefix_lookups, ("group", ""),
                     lambda s: each(s.groups, ("hit", "miss"))),
            Labelled(self.slo_attained, ("backend", ""), lambda s: each(s.backends, _CLASSES)),
            Labelled(self.slo_missed, ("backend", ""), lambda s: each(s.backends, _CLASSES)),
            Labelled(self.forecast_error, ("backend", ""),
                     lambda s: each(s.backends, _CLASSES)),
            Labelled(self.tenant_tokens, ("backend", ""),
                     lambda s: each(s.backends, s.tenants)),
            Labelled(self.tenant_wait, ("backend", ""),
                     lambda s: each(s.backends, s.tenants)),
        ]

    def usage_rejected(self, backend: str) -> None:
        self.engine_usage_rejected.add((backend,), 1)

    def add_cost(self, backend: str, currency: str, amount: float) -> None:
        self.cost.add((backend, currency), amount)

    def watch_coordinator(self, healthy: Callable[[], bool]) -> None:
        Gauge("slotgate_redis_up", "1 while the shared pools' Redis answers (breaker closed)",
              registry=self.registry).set_function(lambda: 1.0 if healthy() else 0.0)

    def watch_ledger(self, ledger: Ledger) -> None:
        Gauge("slotgate_ledger_pending_rows", "Ledger rows not yet written",
              registry=self.registry).set_function(lambda: ledger.pending)
        self.registry.register(LedgerCollector(ledger))

    def watch(self, pool: SlotPool) -> BackendSeries:
        """Export the pool's gauges (again after a reload changed it: a backend may have
        become a group); its counters start at the next `configure`. Returns the series its
        requests update, for its backend to keep."""
        self._pools[pool.name] = pool
        self._groups.discard(pool.name)
        if len(pool.seats()) > 1:
            self._groups.add(pool.name)
        return BackendSeries(self, pool.name)

    def configure(self, config: Config) -> None:
        """Every series whose labels the config names, at 0 before its first event; those
        of backends, replicas and routes it no longer names, removed (a tenant's are kept).
        Called once the config's pools are watched, at startup and after every reload.

        The tenant label's values: the configured keys' tenants (auth on; with it off a
        request's tenant is a hash of its key: OTHER_TENANT), and OTHER_TENANT; none
        without keys (no request has a tenant)."""
        self._by_tenant = bool(config.auth.keys)
        auth = config.auth
        self._tenants = frozenset(k.tenant for k in auth.keys) if auth.enabled else frozenset()
        for name in self._pools.keys() - config.backends.keys():  # removed: idle until restart
            del self._pools[name]
            self._groups.discard(name)
            self.queue_wait.remove(name)
        for name in self._pools:
            self.queue_wait.labels(name)
        tenants = (*sorted(self._tenants), OTHER_TENANT) if self._by_tenant else ()
        scope = Scope.of(config, self._pools, tenants)
        rescope(self._labelled, self._scope, scope)
        self._scope = scope
        self._kinds.clear()  # (their series may have been removed)

    def record(self, rec: RequestRecord, primary: str | None,
               failed: FailureKind | None = None) -> None:
        """Everything a finished request tells, from its record (`failed`: how its upstream
        exchange failed, if it did)."""
        backend = rec.backend
        if backend is None:
            if rec.status:
                self.requests.add((rec.route or "unknown", NO_BACKEND,
                                   f"{rec.status // 100}xx", rec.api))
            if rec.error in AUTH_FAILURES:
                self.auth_failures.add((rec.error,))
            return
        if (rec.error is not None or failed is not None or rec.disconnect is not None
                or rec.pick is not None or rec.reason != _PRIMARY):
            self._unusual(rec, backend, primary, failed)
        kind = (rec.route, backend, rec.replica, rec.api, rec.status,
                self.tenant_label(rec.tenant) if self._by_tenant else None)
        served = self._kinds.get(kind)
        if served is None:
            if len(self._kinds) >= MAX_KINDS:
                self._kinds.clear()
            served = self._kinds[kind] = self._families.served(kind)
        if served.requests is not None:
            served.requests[0] += 1
            if served.replica_requests is not None:
                served.replica_requests[0] += 1
        if rec.ttft_ms is not None:
            self.ttft.observe(served.ttft, rec.ttft_ms / 1000)
            if served.replica_ttft is not None:
                self.replica_ttft.observe(served.replica_ttft, rec.ttft_ms / 1000)
        if rec.prompt_tokens is not None:
            completion = rec.completion_tokens or 0
            served.tokens_in[0] += rec.prompt_tokens
            served.tokens_out[0] += completion
            if served.tenant_tokens is not None:  # its tenant's share: its tokens, and
                served.tenant_tokens[0] += rec.prompt_tokens + completion
        # its wait if it reached the line (got a slot, or waited and left)
        if served.tenant_wait is not None and (rec.slot_at is not None or rec.queue_wait_ms):
            self.tenant_wait.observe(served.tenant_wait, rec.queue_wait_ms / 1000)

    def _unusual(self, rec: RequestRecord, backend: str, primary: str | None,
                 failed: FailureKind | None) -> None:
        """What only some requests tell: a refusal by the key check, an upstream failure,
        a client that left, a move to a fallback, a group's replica pick."""
        if rec.error in AUTH_FAILURES:
            self.auth_failures.add((rec.error,))
        elif failed is not None and (kind := metric_kind(failed)) is not None:
            self.upstream_errors.add((backend, kind))
        if rec.disconnect is not None:
            self.disconnects.add((backend, rec.disconnect.value))
        if rec.reason and rec.reason.startswith("fallback:") and primary:
            intent = "overflow" if rec.reason == "fallback:overflow" else rec.intent or "unknown"
            self.fallbacks.add((primary, backend, intent))
        if rec.pick is not None and backend in self._groups:  # a retry elsewhere may
            self.picks.add((backend, rec.pick))  # leave its first group's pick behind
            if rec.prefix_blocks is not None:
                self.prefix_lookups.add((backend, "hit" if rec.prefix_blocks else "miss"))

    def tenant_label(self, tenant: str | None) -> str:
        """The tenant label of a request of `tenant`."""
        return tenant if tenant in self._tenants else OTHER_TENANT

    def judged(self, rec: RequestRecord, verdict: Verdict) -> bool:
        """Count a request's verdict on its TTFT objective (and, with a first token, how far
        off its forecast was); returns whether it was attained. Its backend is the one that
        served it, else its route's primary (refused at admission)."""
        labels = (rec.backend or rec.primary or NO_BACKEND, rec.priority)
        attained = verdict is Verdict.ATTAINED
        (self.slo_attained if attained else self.slo_missed).add(labels)
        if rec.ttft_ms is not None and rec.predicted_ttft_ms is not None:
            ratio = (max(rec.ttft_ms, _FORECAST_FLOOR_MS)
                     / max(rec.predicted_ttft_ms, _FORECAST_FLOOR_MS))
            self.forecast_error.observe(self.forecast_error.series(labels), math.log2(ratio))
        return attained

    def exposition(self, tenant: str | None = None) -> bytes:
        """The text exposition; with `tenant`, the per-tenant families hold only that
        tenant's series ("" for none). Rendered once either way: the families are filtered
        as they are collected, before any text is written."""
        if tenant is None:
            return generate_latest(self.registry)
        names = frozenset({self.tenant_tokens.name, self.tenant_wait.name})
        return generate_latest(_OneTenant(self.registry, names, self.tenant_label(tenant)
                                          if tenant else None))


class BackendSeries:
    """The series of one backend that each of its requests updates, looked up once
    (`Metrics.watch`) rather than by its name per request. A reload that removes the
    backend drops them from the exposition: its requests still running update them unseen."""

    __slots__ = ("_holding", "_spread", "queue_wait")

    def __init__(self, metrics: Metrics, name: str) -> None:
        self.queue_wait = metrics.queue_wait.labels(name)  # its requests' waits in line
        self._spread = metrics.holding
        self._holding = metrics.holding.series((name,))

    def held(self, seconds: float) -> None:
        """A request let its slot go after holding it `seconds`."""
        self._spread.observe(self._holding, seconds)


class _OneTenant:
    """A registry's families with the per-tenant ones cut to one tenant's series (None:
    none), for generate_latest (which reads only `collect()`)."""

    def __init__(self, registry: CollectorRegistry, names: frozenset[str],
                 tenant: str | None) -> None:
        self.registry, self.names, self.tenant = registry, names, tenant

    def collect(self) -> Iterator[Metric]:
        tenant = self.tenant
        for family in self.registry.collect():
            if family.name in self.names:
                family.samples = ([s for s in family.samples if s.labels["tenant"] == tenant]
                                  if tenant is not None else [])
            yield family
