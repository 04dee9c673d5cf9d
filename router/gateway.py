"""The gateway's long-lived state, stored on the app under one typed key.

Built and torn down by `router.app`; read by the request path.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from classifier.model import IntentClassifier
from policies.config import Config
from policies.experiments import Experiment
from policies.handover import MoveOffers
from policies.pricing import SlotTimeModel
from policies.slots import SlotPool
from router.ledger import Ledger
from router.metrics import Metrics
from router.proxy import Upstream
from router.usage import ledger_row

if TYPE_CHECKING:
    from policies.redis_slots import RedisCoordinator
    from router.dispatch import RequestRecord
    from router.simulated import RunningSim

RECENT_RECORDS = 1000


@dataclass
class Gateway:
    config: Config
    pools: dict[str, SlotPool] = field(default_factory=dict)
    upstreams: dict[str, Upstream] = field(default_factory=dict)
    simulators: dict[str, RunningSim] = field(default_factory=dict)
    offers: dict[str, MoveOffers] = field(default_factory=dict)  # per fallback pool
    classifier: IntentClassifier | None = None  # loaded when a route steers by intent
    recent: deque[RequestRecord] = field(default_factory=lambda: deque(maxlen=RECENT_RECORDS))
    experiments: dict[str, Experiment] = field(default_factory=dict)  # by the route they split
    ledger: Ledger | None = None
    coordinator: RedisCoordinator | None = None  # coordination.mode: redis
    slot_time: dict[str, SlotTimeModel] = field(default_factory=dict)  # per backend
    ready: bool = False

    metrics: Metrics = field(default_factory=Metrics)

    def record(self, rec: RequestRecord) -> None:
        self.recent.append(rec)
        self.metrics.record(rec, rec.primary)
        if rec.backend is not None and rec.status == 200 and not rec.tokens_estimated:
            model = self.slot_time.get(rec.backend)
            if model is not None:
                model.observe(rec.completion_tokens or 0, rec.slot_ms / 1000)
        if self.ledger is not None:
            row = ledger_row(rec, self.config, self.slot_time)
            self.ledger.add(row)
            if row.cost and row.backend is not None:
                self.metrics.add_cost(row.backend, self.config.currency, row.cost)


GATEWAY = web.AppKey("gateway", Gateway)
