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
from policies.handover import MoveOffers
from policies.slots import LocalSlotPool
from router.metrics import Metrics
from router.proxy import Upstream

if TYPE_CHECKING:
    from router.dispatch import RequestRecord
    from router.simulated import RunningSim

RECENT_RECORDS = 1000


@dataclass
class Gateway:
    config: Config
    pools: dict[str, LocalSlotPool] = field(default_factory=dict)
    upstreams: dict[str, Upstream] = field(default_factory=dict)
    simulators: dict[str, RunningSim] = field(default_factory=dict)
    offers: dict[str, MoveOffers] = field(default_factory=dict)  # per fallback pool
    classifier: IntentClassifier | None = None  # loaded when a route steers by intent
    recent: deque[RequestRecord] = field(default_factory=lambda: deque(maxlen=RECENT_RECORDS))
    ready: bool = False

    metrics: Metrics = field(default_factory=Metrics)

    def record(self, rec: RequestRecord) -> None:
        self.recent.append(rec)
        route = self.config.routes.get(rec.route) if rec.route else None
        self.metrics.record(rec, route.primary if route else None)


GATEWAY = web.AppKey("gateway", Gateway)
