"""The gateway's long-lived state, stored on the app under one typed key.

Built and torn down by `router.app`; read by the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from classifier.model import IntentClassifier
from policies.config import AuthConfig, Config, Public
from policies.limits.quotas import Quotas
from policies.pricing.experiments import Experiment
from policies.scheduler.admission import RejectReason
from policies.slots.stall import StallClock
from router.apis.dialect import OPENAI, Dialect
from router.backend import Backend
from router.batch.preempt import RunningLines
from router.common.errors import ApiError
from router.ledger.base import Ledger
from router.request.access_log import KeyRefusals, LogSampler
from router.request.auth import Keyring
from router.request.big_body import BigBodies
from router.request.body import InflightBodies
from router.request.rejections import rejection
from router.telemetry.metrics import Metrics
from router.upstream.health import BackendHealth
from router.upstream.replica_health import ReplicaHealth

if TYPE_CHECKING:
    from policies.slots.coordinator import RedisCoordinator
    from policies.slots.limits import SharedQuotas
    from router.batch.files import Files
    from router.batch.jobs import Jobs
    from router.batch.runner import BatchRunner
    from router.common.record import RequestRecord
    from router.fleet.groups import DiscoveredGroups
    from router.fleet.shared_drains import SharedDrains
    from router.fleet.signals import FleetSignals
    from router.quality.shadows import ShadowRunner
    from router.tracing.otel import Tracer

RECENT_RECORDS = 1000


@dataclass
class Gateway:
    config: Config
    backends: dict[str, Backend] = field(default_factory=dict)  # a removed one stays, idle
    classifier: IntentClassifier | None = None  # loaded when a route steers by intent
    recent: deque[RequestRecord] = field(default_factory=lambda: deque(maxlen=RECENT_RECORDS))
    experiments: dict[str, Experiment] = field(default_factory=dict)  # by the route they split
    ledger: Ledger | None = None
    files: Files | None = None  # the Files API's (with a ledger, at startup)
    jobs: Jobs | None = None  # the Batches API's (with a ledger, at startup)
    batch_runner: BatchRunner | None = None  # runs the jobs' lines (once serving)
    batch_lines: RunningLines = field(default_factory=RunningLines)  # holding slots
    shadows: ShadowRunner | None = None  # shadow comparisons, when a route samples them
    fleet: FleetSignals | None = None  # desired replica counts, when a backend scales
    discovery: DiscoveredGroups | None = None  # groups found in DNS or files, kept current
    coordinator: RedisCoordinator | None = None  # coordination.mode: redis
    drains: SharedDrains | None = None  # with the coordinator: drains reach every gateway
    health: BackendHealth = field(default_factory=BackendHealth)  # breakers, retries
    replica_health: ReplicaHealth = field(init=False)  # breakers of grouped backends' replicas
    keyring: Keyring = field(default_factory=lambda: Keyring(AuthConfig()))  # auth off
    quotas: Quotas = field(default_factory=lambda: Quotas(()))  # per-key limits, this process
    shared_quotas: SharedQuotas | None = None  # per-key limits in Redis (coordination: redis)
    bodies: InflightBodies = field(default_factory=InflightBodies)  # request bytes held
    big_bodies: BigBodies = field(default_factory=BigBodies)  # parsed off the loop
    config_path: str | None = None  # what a reload reads (None: the embedded config)
    ready: bool = False
    draining: bool = False  # shutting down: new and queued requests get 503 + Retry-After
    cutting: bool = False  # the drain timed out: requests still running are being cut
    handlers: set[asyncio.Task[object]] = field(default_factory=set)  # requests inside now
    _drain: asyncio.Future[None] | None = None
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    metrics: Metrics = field(default_factory=Metrics)
    tracer: Tracer | None = None  # tracing.enabled: spans of every request (at startup)
    refusals: LogSampler = field(default_factory=LogSampler)  # access lines of unknown callers
    key_refusals: KeyRefusals = field(default_factory=KeyRefusals)  # a valid key's refusals
    stalls: StallClock = field(init=False)  # the event loop's stalls (metrics, Redis calls)

    def __post_init__(self) -> None:
        self.replica_health = ReplicaHealth(self.health)
        self.stalls = StallClock(self.metrics.loop_stalls.observe)

    def drain_signal(self) -> asyncio.Future[None]:
        """Resolved when draining starts: queued requests stop waiting on it."""
        if self._drain is None:
            self._drain = asyncio.get_running_loop().create_future()
        return self._drain

    @property
    def running(self) -> int:
        """Requests inside the handler now."""
        return len(self.handlers)

    def leave(self, task: asyncio.Task[object]) -> None:
        self.handlers.discard(task)
        if not self.handlers:
            self._idle.set()

    async def cut(self, timeout_s: float = 1.0) -> None:
        """After a drain that timed out: end the requests still running, each telling its
        client why (their handlers see `cutting`), while their connections are open."""
        self.cutting = True
        tasks = list(self.handlers)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    async def drain(self, timeout_s: float) -> int:
        """Stop admitting (readiness fails, new and queued requests get 503 + Retry-After)
        and wait up to `timeout_s` for the requests already running; returns how many are
        still running then."""
        self.ready, self.draining = False, True
        signal = self.drain_signal()
        if not signal.done():
            signal.set_result(None)
        if self.running:
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._idle.wait()
        return self.running

    def guard(self, request: web.Request, what: Public | None,
              dialect: Dialect = OPENAI) -> web.Response | None:
        """None when the caller may have `what` (None: any endpoint's key check), else its
        refusal (401, or 400 for two keys) in `dialect`, counted in
        slotgate_auth_failures_total."""
        try:
            if what is None:
                self.keyring.caller(request)
            else:
                self.keyring.check(request, what)
        except ApiError as err:
            self.metrics.auth_failures.add((err.code or "",))
            return dialect.error_response(err, self.config.server.retry_after_min_s)
        return None

    def refuse(self, reason: RejectReason, after_s: float, backend: str | None = None,
               message: str | None = None) -> ApiError:
        """A refusal of the gateway's own (router/request/rejections.py)."""
        return rejection(self.metrics, self.config.server, reason, after_s, backend, message)

    def bodies_full(self) -> ApiError:
        """The answer when the process holds its bound of request bodies."""
        return self.refuse(RejectReason.BODY_BYTES, 0)


GATEWAY = web.AppKey("gateway", Gateway)
