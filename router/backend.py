"""One backend as the gateway holds it: its engine connections, slot pool, queue reporter,
slot-time model, move offers and simulated engine, built, changed and closed as one.

Its breaker lives in `BackendHealth` with the others: the retry budget and the breakers'
probes are shared by every backend of the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from policies.config import BackendConfig, CoordinationConfig
from policies.pricing import SlotTimeModel
from policies.slots import SlotPool
from policies.slots.handover import MoveOffers
from router.request.queue_report import QueueReporter
from router.upstream.client import HttpPool
from router.upstream.pools import make_pool
from router.upstream.proxy import Upstream
from router.upstream.simulated.app import start_simulator

if TYPE_CHECKING:
    from policies.slots.coordinator import RedisCoordinator
    from router.upstream.simulated.app import RunningSim


@dataclass(slots=True)
class Backend:
    name: str
    upstream: Upstream  # its config, where it answers, its keep-alive connections
    pool: SlotPool
    reporter: QueueReporter  # positions and ETAs for the streams in its queue
    slot_time: SlotTimeModel  # how long its answers hold a slot, by length
    simulator: RunningSim | None = None  # `simulated:` backends run their engine in-process
    offers: MoveOffers | None = None  # set when a steering route may move requests onto it

    @property
    def config(self) -> BackendConfig:
        return self.upstream.config

    def change(self, config: BackendConfig) -> None:
        """A reload changed its config: new requests see it; the connections are kept, and
        leases already held stay valid (a smaller pool admits no one until enough free)."""
        http = self.upstream.http
        http.max_idle_per_origin = config.slots
        self.upstream = Upstream(self.name, config, _base_url(config, self.simulator), http)
        self.pool.resize(config.slots, config.queue_limit)

    async def close(self) -> None:
        await self.upstream.http.close()
        if self.simulator is not None:
            await self.simulator.close()


async def open_backend(name: str, config: BackendConfig, coordination: CoordinationConfig,
                       coordinator: RedisCoordinator | None) -> Backend:
    """The engine (or its simulator), the connections to it and its slot pool."""
    simulator = None
    if config.simulated is not None:
        simulator = await start_simulator(config.simulated, config.model)
    # sized to the slots: every request in flight may leave a connection to keep
    upstream = Upstream(name, config, _base_url(config, simulator),
                        HttpPool(max_idle_per_origin=config.slots))
    pool = make_pool(name, config, coordination, coordinator)
    return Backend(name, upstream, pool, QueueReporter(pool),
                   SlotTimeModel(config.initial_hold_s), simulator)


def _base_url(config: BackendConfig, simulator: RunningSim | None) -> str:
    """The backend's OpenAI base URL, ending in /v1."""
    return simulator.url + "/v1" if simulator is not None else str(config.url).rstrip("/")
