"""What `/metrics` reads from the gateway's state when it is scraped, not counted as
requests go: each pool's and replica's slots, queue and health, the ledger writer's counts.
Nothing here runs on a request's path."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from policies.slots import SlotPool
    from router.ledger.base import Ledger


class PoolCollector(Collector):
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


class ReplicaCollector(Collector):
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


class LedgerCollector(Collector):
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
