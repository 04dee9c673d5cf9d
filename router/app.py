"""create_app(config) -> web.Application, and the runner that serves it.

Everything long-lived (simulated engines, upstream sessions, pools) is built in one
cleanup context and torn down in reverse; nothing lives at module level.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from policies.config import Config, CoordinationMode, Public, RedisDown
from policies.limits.quotas import Quotas, period_bounds
from policies.slots.base import SlotPool
from router import dispatch
from router.apis.anthropic import ANTHROPIC
from router.apis.anthropic_endpoints import count_tokens, model_list
from router.apis.dialect import OPENAI
from router.apis.responses_socket import responses_socket
from router.assembly import add_backend, health_check, replica_check, wire_routes
from router.batch import batches_api, files_api, message_batches_api
from router.batch.files import Files, files_dir
from router.batch.jobs import Jobs
from router.batch.metrics import BatchCollector
from router.batch.runner import BatchRunner
from router.common.errors import ApiError
from router.common.parsed import Endpoint
from router.console import admin, pages
from router.fleet.groups import start_discovery
from router.fleet.shared import SharedDemand
from router.fleet.shared_drains import SharedDrains
from router.fleet.signals import FleetCollector, FleetSignals
from router.gateway import GATEWAY, Gateway
from router.ledger.base import Ledger
from router.ledger.open import open_ledger
from router.quality.metrics import ShadowCollector
from router.quality.shadows import ShadowRunner
from router.request.auth import Keyring
from router.server.no_route import add_fallback
from router.server.runner import GatewayRunner, expect_continue, request_line_limit
from router.tracing import start_tracer
from router.upstream.pools import start_coordinator

if TYPE_CHECKING:
    from policies.slots.coordinator import RedisCoordinator
    from policies.slots.limits import SharedQuotas

log = logging.getLogger("slotgate")


def create_app(config: Config) -> web.Application:
    app = web.Application(
        client_max_size=config.server.max_body_bytes,
        handler_args={
            "max_line_size": request_line_limit(config.server.max_header_bytes),
            "max_field_size": config.server.max_header_bytes,
        },
    )
    app[GATEWAY] = Gateway(config)
    app.cleanup_ctx.append(_gateway_ctx)
    # partials, not wrappers: no extra coroutine frame per request (thousands may queue)
    app.router.add_post("/v1/chat/completions", partial(dispatch.handle, endpoint=Endpoint.CHAT),
                        expect_handler=expect_continue)
    app.router.add_post("/v1/completions",
                        partial(dispatch.handle, endpoint=Endpoint.COMPLETIONS),
                        expect_handler=expect_continue)
    app.router.add_post("/v1/messages", partial(dispatch.handle, endpoint=Endpoint.MESSAGES),
                        expect_handler=expect_continue)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
    app.router.add_post("/v1/responses", partial(dispatch.handle, endpoint=Endpoint.RESPONSES),
                        expect_handler=expect_continue)
    app.router.add_get("/v1/responses", responses_socket)  # WebSocket mode: 426, logged
    app.router.add_post("/v1/embeddings", partial(dispatch.handle, endpoint=Endpoint.EMBEDDINGS),
                        expect_handler=expect_continue)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/openapi.json", _openapi)
    pages.setup(app)
    admin.setup(app)
    files_api.setup(app)
    batches_api.setup(app)
    message_batches_api.setup(app)
    add_fallback(app)  # last: what no route above takes
    return app


async def seed_quotas(gw: Gateway, ledger: Ledger) -> None:
    """Budgets survive a restart: each key starts with what the ledger says it used (in
    Redis, where Redis has no spend for the period yet)."""
    quotas = gw.quotas
    for period in quotas.periods():
        start, _ = period_bounds(period, quotas.clock())
        spent = await ledger.store.spent(start)
        quotas.seed(period, spent)
        if gw.shared_quotas is not None:
            await gw.shared_quotas.seed(period, spent)


def shared_quotas(coordinator: RedisCoordinator, config: Config) -> SharedQuotas:
    """The per-key limits in Redis, with this process's share of them while it is away
    (`fail_open_local`), or none (`fail_closed`)."""
    from policies.slots.limits import SharedQuotas

    coordination, keys = config.coordination, config.auth.keys
    fallback = (Quotas(keys, share=coordination.expected_replicas)
                if coordination.on_redis_down is RedisDown.FAIL_OPEN_LOCAL else None)
    return SharedQuotas(coordinator, keys, coordination.lease_ttl_s, fallback)


async def _gateway_ctx(app: web.Application) -> AsyncIterator[None]:
    gw = app[GATEWAY]
    try:
        gw.tracer = start_tracer(gw.config.tracing)  # None when off (the default)
        if gw.config.coordination.mode is CoordinationMode.REDIS:
            gw.coordinator = await start_coordinator(gw.config.coordination, gw.stalls)
        gw.keyring = Keyring(gw.config.auth)
        gw.quotas = Quotas(gw.config.auth.keys)
        if gw.coordinator is not None:
            gw.shared_quotas = shared_quotas(gw.coordinator, gw.config)
            gw.quotas = gw.shared_quotas.fallback or gw.quotas
            gw.shared_quotas.start()
        gw.health.probe = lambda name: health_check(gw, name)
        gw.replica_health.probe = lambda name, replica: replica_check(gw, name, replica)
        for name, backend in gw.config.backends.items():
            await add_backend(gw, name, backend)
        start_discovery(gw)
        gw.metrics.configure(gw.config)  # the series it names, at 0
        if gw.coordinator is not None:
            gw.drains = SharedDrains(lambda: gw.backends, lambda: gw.config.fleet.refresh_s,
                                     gw.coordinator)  # its channel: subscribed at start
            gw.coordinator.start()  # subscribes to the wake-ups of the pools just made
            await gw.drains.start()  # the replicas drained by other gateways, before serving
            gw.metrics.watch_coordinator(gw.coordinator.healthy.is_set)
        wire_routes(gw)
        if gw.config.ledger.enabled:
            gw.ledger = open_ledger(gw.config.ledger)
            await gw.ledger.start()
            await seed_quotas(gw, gw.ledger)
            gw.files = Files(gw.ledger.store, files_dir(gw.config.batch, gw.config.ledger.path),
                             gw.config.batch)
            gw.jobs = Jobs(gw.ledger.store, gw.files, frozenset(gw.config.routes),
                           gw.config.server)
            gw.metrics.watch_ledger(gw.ledger)
        gw.stalls.start()  # from here on: startup's own work is no stall of serving
        gw.ready = True
        yield
    finally:
        gw.ready = False
        gw.stalls.stop()
        if gw.discovery is not None:
            await gw.discovery.close()
        await gw.health.close()
        await gw.replica_health.close()
        if gw.ledger is not None:
            await gw.ledger.close()  # after the server stopped taking requests: every row
        for opened in gw.backends.values():
            await opened.close()
        if gw.drains is not None:
            await gw.drains.close()
        if gw.shared_quotas is not None:
            await gw.shared_quotas.close()  # its settles finish with the coordinator's
        if gw.coordinator is not None:
            await gw.coordinator.close()
        gw.big_bodies.close()
        if gw.tracer is not None:  # the spans of the last requests, flushed off the loop
            await asyncio.to_thread(gw.tracer.close)


async def _models(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    anthropic = "anthropic-version" in request.headers  # an Anthropic client: its shapes
    if (refused := gw.guard(request, Public.MODELS, ANTHROPIC if anthropic else OPENAI)
            ) is not None:
        return refused
    config = gw.config
    if anthropic:
        return web.json_response(model_list(list(config.routes)), dumps=_dumps)
    data = [
        {"id": name, "object": "model", "created": 0, "owned_by": "slotgate"}
        for name in config.routes
    ]
    return web.json_response({"object": "list", "data": data}, dumps=_dumps)


async def _metrics(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    if (refused := gw.guard(request, Public.METRICS)) is not None:
        return refused
    try:
        tenant = gw.keyring.tenants_seen(request, Public.METRICS)
    except ApiError as err:  # (a key that `guard` let through: not reached)
        return err.response()
    body = gw.metrics.exposition(tenant)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _openapi(request: web.Request) -> web.Response:
    from router.console.openapi import openapi

    gw = request.app[GATEWAY]
    if (refused := gw.guard(request, Public.OPENAPI)) is not None:
        return refused
    return web.json_response(openapi(gw.config), dumps=_dumps)


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    ready = request.app[GATEWAY].ready
    return web.json_response({"ready": ready}, status=200 if ready else 503)


def _dumps(obj: object) -> str:
    return orjson.dumps(obj).decode()


@dataclass
class RunningGateway:
    app: web.Application
    runner: web.AppRunner
    url: str  # e.g. http://127.0.0.1:8080

    @property
    def gateway(self) -> Gateway:
        return self.app[GATEWAY]

    async def reload(self) -> None:
        """Re-read the config file it was started with; log what changed or why not."""
        from router.reload import ReloadRefused, reload_file

        try:
            await reload_file(self.gateway, self.gateway.config_path)
        except ReloadRefused as exc:
            log.warning("config reload refused, the running config is kept:\n  %s",
                        "\n  ".join(exc.problems))

    async def close(self) -> None:
        """Drain (readiness fails; new and queued requests get 503 + Retry-After; running
        ones finish, up to `server.shutdown_timeout_s`), then stop. The ledger is flushed."""
        limit = self.gateway.config.server.shutdown_timeout_s
        log.info("draining: not ready; new and queued requests get 503; waiting up to %g s "
                 "for %d running", limit, self.gateway.running)
        if self.gateway.batch_runner is not None:  # its running lines run again later
            await self.gateway.batch_runner.close()
        if self.gateway.shadows is not None:  # those waiting are dropped: samples only
            await self.gateway.shadows.close()
        if self.gateway.fleet is not None:
            await self.gateway.fleet.close()
        left = await self.gateway.drain(limit)
        if left:
            log.warning("shutdown: %d requests still running after %g s are cut", left, limit)
            await self.gateway.cut()
        await self.runner.cleanup()


async def start_own_work(gw: Gateway, host: str, port: int) -> None:
    """Once the gateway listens, what it sends to itself in idle slots: the batch jobs'
    lines (with a ledger) and the shadow comparisons (when a route samples them)."""
    own = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    url = f"http://{f'[{own}]' if ':' in own else own}:{port}"

    def primary(model: str) -> SlotPool | None:
        route = gw.config.routes.get(model)
        backend = gw.backends.get(route.primary) if route is not None else None
        return backend.pool if backend is not None else None

    if gw.jobs is not None:
        gw.batch_runner = BatchRunner(gw.jobs, url, gw.keyring.batch_secret,
                                      lambda: gw.config.batch, primary,
                                      lambda: [b.pool for b in gw.backends.values()],
                                      gw.batch_lines.count)
        await gw.batch_runner.start()
        gw.metrics.registry.register(BatchCollector(gw.batch_runner, gw.batch_lines))
    start_fleet(gw)
    if any(route.quality.shadow_rate > 0 for route in gw.config.routes.values()):
        gw.shadows = ShadowRunner(lambda: gw.config, url, gw.keyring.batch_secret, primary,
                                  gw.ledger.store if gw.ledger is not None else None)
        await gw.shadows.start()
        gw.metrics.registry.register(ShadowCollector(gw.shadows))


def start_fleet(gw: Gateway) -> None:
    """The desired replica counts of the backends with `scaling` (docs/autoscaling.md):
    started whatever the config, so that a reload adding `scaling` is counted at the next
    look (a look with none to count does nothing)."""
    holding = gw.metrics.holding
    gw.fleet = FleetSignals(
        lambda: gw.config, lambda name: sum(holding.series((name,))[:-1]),
        lambda name: gw.backends[name].clock.holds.mean_s,
        lambda name: gw.backends[name].pool.queued,
        lambda name: sum(not r.retired for r in gw.backends[name].replicas.values()),
        SharedDemand(gw.coordinator) if gw.coordinator is not None else None,
        lambda name: gw.backends[name].pool.active)
    gw.fleet.start()
    gw.metrics.registry.register(FleetCollector(gw.fleet))


async def start_gateway(config: Config, host: str | None = None, port: int | None = None,
                        *, reuse_port: bool = False, config_path: str | None = None
                        ) -> RunningGateway:
    """Serve `config` on host:port (port 0 picks a free one) until `close()`.
    `config_path` is where a reload reads it again (None: the embedded config)."""
    app = create_app(config)
    app[GATEWAY].config_path = config_path
    runner = GatewayRunner(
        app, config.server, sum(backend.slots for backend in config.backends.values()),
        handler_cancellation=True,  # a client that leaves cancels its handler: slot freed
        access_log=None,
        shutdown_timeout=1.0,  # after our own drain (RunningGateway.close)
    )
    await runner.setup()
    host = host if host is not None else config.server.host
    port = port if port is not None else config.server.port
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_port=reuse_port or None)
    await site.start()
    bound = runner.addresses[0][1]
    url = f"http://{host}:{bound}"
    await start_own_work(app[GATEWAY], host, bound)
    for name, backend in config.backends.items():
        where = "simulated" if backend.simulated is not None else str(backend.url)
        log.info("backend %s: %s, %d slots, queue %d (%g s), model %s", name, where,
                 backend.slots, backend.queue_limit, backend.queue_timeout_s, backend.model)
    for name, route in config.routes.items():
        log.info("route %s -> %s%s, overflow %s, intent fallback %s", name, route.primary,
                 "".join(f" | {f}" for f in route.fallbacks), route.overflow.value,
                 route.fallback.when.value)
    if runner.guard is not None:
        log.info("connections: at most %d open, %d per client address; heads within %g s",
                 runner.guard.max_connections, runner.guard.max_per_client,
                 runner.guard.head_timeout)
    log.info("content logging %s", "ON: prompts appear in the access log"
             if config.logging.content else "off")
    if config.auth.enabled:
        log.info("auth on: %d client keys; public without a key: %s", len(config.auth.keys),
                 ", ".join(sorted(config.auth.public)) or "only /healthz and /readyz")
    else:
        log.warning("auth off: every client is accepted, /admin/* included "
                    "(for local use; see auth in docs/CONFIG.md)")
    log.info("slotgate listening on %s (%d backends, %d routes)", url,
             len(config.backends), len(config.routes))
    return RunningGateway(app, runner, url)
