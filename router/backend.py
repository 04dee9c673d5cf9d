"""One backend as the gateway holds it: a group of engine replicas (each with its
connections, its breaker in a group and, when simulated, its engine) behind one slot pool,
with its queue reporter, clock, breaker, metric series, move offers and the picking state
(prefix affinity table, round-robin cursor), built, changed and closed as one.

The breakers are made and watched by `BackendHealth` and `ReplicaHealth`, which keep them
by name as well for what is the gateway's: the retry budget, the health checks and the
scheduler's view of every backend's standing (`router.assembly.watch` hands them out).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from policies.clock.answers import hints
from policies.clock.clock import Clock
from policies.config import BackendConfig, CoordinationConfig, EndpointConfig
from policies.fleet.warmup import Warmup
from policies.health.breaker import CircuitBreaker
from policies.scheduler.pick import PickMode
from policies.scheduler.prefix import AffinityTable
from policies.slots import SlotPool
from policies.slots.handover import MoveOffers
from router.request.queue_report import QueueReporter
from router.upstream.client import HttpPool
from router.upstream.pools import make_pool, tune
from router.upstream.proxy import Upstream
from router.upstream.signals import Reading, scrape_forever, stop
from router.upstream.simulated.app import start_simulator

if TYPE_CHECKING:
    from policies.slots.coordinator import RedisCoordinator
    from router.telemetry.metrics import BackendSeries
    from router.upstream.simulated.app import RunningSim


@dataclass(slots=True)
class Replica:
    """One engine of the group."""

    name: str
    upstream: Upstream  # where it answers, with which key, over which connections
    simulator: RunningSim | None = None  # a `simulated:` endpoint runs in-process
    load_tokens: int = 0  # prompt and expected output tokens of the requests it runs now
    retired: bool = False  # a reload removed it: it runs out what it holds
    breaker: CircuitBreaker | None = None  # in a group (ReplicaHealth); one engine: the backend's


@dataclass(slots=True)
class Backend:
    name: str
    config: BackendConfig
    replicas: dict[str, Replica]  # retired ones stay until the process ends (a few objects)
    pool: SlotPool
    reporter: QueueReporter  # positions and ETAs for the streams in its queue
    clock: Clock  # how long its answers take: holds, rates, lengths, slot time, prefill
    offers: MoveOffers | None = None  # set when a steering route may move requests onto it
    affinity: AffinityTable | None = None  # prompt prefix -> replica, when affinity picks
    cursor: int = field(default=0)  # round robin's next turn
    # Replicas drained by an admin (router.fleet.drain): kept out of service by discovery's
    # refreshes while they are still found; a reload of the config brings them back.
    drained: set[str] = field(default_factory=set)
    readings: dict[str, Reading] = field(default_factory=dict)  # engines' KV pressure
    scraper: asyncio.Task[None] | None = None  # reads them, with `signals.scrape`
    # More than one replica (retired ones included): a request's replica is picked. Kept,
    # not computed: every request asks.
    grouped: bool = field(init=False)
    # Set as it is assembled, before any request sees it (`router.assembly.watch`), and
    # again after a reload changed it.
    breaker: CircuitBreaker = field(init=False, repr=False)  # from BackendHealth
    series: BackendSeries = field(init=False, repr=False)  # from Metrics.watch

    def __post_init__(self) -> None:
        self.grouped = _grouped(self.config, self.replicas)

    def first(self) -> Replica:
        return next(iter(self.replicas.values()))
    async def change(self, config: BackendConfig, unready: Collection[str] = ()) -> None:
        """A reload (or discovery) changed its config: new requests see it; the
        connections of replicas kept are kept, new replicas open, removed ones run out
        what they hold (leases already held stay valid: a smaller pool admits no one
        until enough free). Those in `unready` serve nothing until their health check
        passes (`ReplicaHealth.add`)."""
        wanted = {e.name: e for e in config.replicas(self.name)
                  if e.name is not None and e.name not in self.drained}
        for name, replica in self.replicas.items():
            replica.retired = name not in wanted
        for name, endpoint in wanted.items():
            old = self.replicas.get(name)
            if old is None:
                self.replicas[name] = await _open_replica(self.name, config, endpoint)
                continue
            http = old.upstream.http
            http.max_idle_per_origin = endpoint.slots
            old.upstream = Upstream(self.name, config, _base_url(endpoint, old.simulator), http,
                                    key_env=endpoint.api_key_env, replica=name)
        self.config, self.grouped = config, _grouped(config, self.replicas)
        self.clock.configure(hints(config), self.grouped)
        self.pool.resize(config.slots, config.queue_limit,
                         {name: e.slots for name, e in wanted.items()}, unready)
        tune(self.pool, config)
        self.affinity = _affinity(config, self.affinity)
        await stop(self.scraper)
        self.scraper = self.start_scraper()

    def start_scraper(self) -> asyncio.Task[None] | None:
        """The background reader of the replicas' engine metrics, when asked for."""
        signals = self.config.signals
        if not (signals.scrape and self.grouped):
            return None
        return asyncio.create_task(scrape_forever(
            lambda: {n: r.upstream for n, r in self.replicas.items() if not r.retired},
            self.readings, signals.path, signals.every_s), name=f"signals-{self.name}")

    async def close(self) -> None:
        await stop(self.scraper)
        for replica in self.replicas.values():
            await replica.upstream.http.close()
            if replica.simulator is not None:
                await replica.simulator.close()


async def open_backend(name: str, config: BackendConfig, coordination: CoordinationConfig,
                       coordinator: RedisCoordinator | None) -> Backend:
    """Each replica's engine (or simulator) and connections, and the group's slot pool."""
    replicas: dict[str, Replica] = {}
    for endpoint in config.replicas(name):
        assert endpoint.name is not None  # named by `replicas`
        replicas[endpoint.name] = await _open_replica(name, config, endpoint)
    clock = Clock(config.initial_hold_s, hints(config), grouped=len(replicas) > 1)
    pool = make_pool(name, config, coordination, coordinator, clock)
    if config.discover is not None:  # none ready yet: cold until one passes its check
        found = config.discover
        pool.cold = Warmup(found.warmup_s, found.warmup_timeout_s, found.slots)
    backend = Backend(name, config, replicas, pool, QueueReporter(pool), clock,
                      affinity=_affinity(config, None))
    backend.scraper = backend.start_scraper()
    return backend


def _grouped(config: BackendConfig, replicas: Mapping[str, Replica]) -> bool:
    """A replica is picked: more than one (retired ones included), or found by discovery
    (a group of any size, its replicas each health-checked)."""
    return len(replicas) > 1 or config.discover is not None


async def _open_replica(backend: str, config: BackendConfig,
                        endpoint: EndpointConfig) -> Replica:
    assert endpoint.name is not None
    simulator = None
    if endpoint.simulated is not None:
        simulator = await start_simulator(endpoint.simulated, config.model)
    # sized to the slots: every request in flight may leave a connection to keep
    upstream = Upstream(backend, config, _base_url(endpoint, simulator),
                        HttpPool(max_idle_per_origin=endpoint.slots),
                        key_env=endpoint.api_key_env, replica=endpoint.name)
    return Replica(endpoint.name, upstream, simulator)


def _affinity(config: BackendConfig, table: AffinityTable | None) -> AffinityTable | None:
    """The prefix table a group picking by affinity keeps (kept across a reload)."""
    if config.pick is not PickMode.AFFINITY or config.endpoints is None \
            or len(config.endpoints) < 2:
        return None
    return table if table is not None else AffinityTable(config.affinity.table_size)


def _base_url(endpoint: EndpointConfig, simulator: RunningSim | None) -> str:
    """The replica's OpenAI base URL, ending in /v1."""
    return simulator.url + "/v1" if simulator is not None else str(endpoint.url).rstrip("/")
