"""Putting a gateway together from its config: each backend's engine session, pool and
simulator, then what the routes need (experiments, move offers, the classifier).

Used at startup and again by a config reload, which adds only what is new.
"""

from __future__ import annotations

import asyncio

from policies.config import BackendConfig, FallbackWhen
from policies.experiments import build_experiments
from policies.pricing import SlotTimeModel
from policies.slots.handover import MoveOffers
from router.gateway import Gateway
from router.openai_api import ApiError
from router.request.queue_report import QueueReporter
from router.upstream.client import HttpPool, UpstreamError
from router.upstream.pools import make_pool
from router.upstream.proxy import Upstream
from router.upstream.simulated.app import start_simulator

_MODELS_LIMIT = 1024 * 1024  # a health check reads at most this much of /v1/models


async def add_backend(gw: Gateway, name: str, backend: BackendConfig) -> None:
    """The engine (or simulator) connections, the slot pool and the holding-time model."""
    if backend.simulated is not None:
        sim = await start_simulator(backend.simulated, backend.model)
        gw.simulators[name] = sim
        base_url = sim.url + "/v1"
    else:
        base_url = str(backend.url).rstrip("/")
    # sized to the slots: every request in flight may leave a connection to keep
    gw.upstreams[name] = Upstream(name, backend, base_url,
                                  HttpPool(max_idle_per_origin=backend.slots))
    gw.pools[name] = make_pool(name, backend, gw.config.coordination, gw.coordinator)
    gw.reporters[name] = QueueReporter(gw.pools[name])
    gw.metrics.watch(gw.pools[name])
    gw.slot_time[name] = SlotTimeModel(backend.initial_hold_s)
    gw.health.add(name, backend)


async def health_check(gw: Gateway, name: str) -> bool:
    """Does the backend answer GET /v1/models with 200 within its connect timeout?"""
    upstream = gw.upstreams[name]
    limit = upstream.config.connect_timeout_s
    try:
        async with asyncio.timeout(limit):
            resp = await upstream.http.request(
                "GET", upstream.target("/models"), upstream.auth_headers().items(), b"",
                connect_timeout_s=limit)
            try:
                await resp.read(_MODELS_LIMIT)  # to the end: the connection is kept
            finally:
                resp.release()
            return resp.status == 200
    except (UpstreamError, ApiError, TimeoutError):
        return False


def wire_routes(gw: Gateway) -> None:
    """Experiments, move offers on every fallback a steering route (or arm) may use, and
    the intent classifier when anything steers."""
    gw.experiments = build_experiments(gw.config.experiments, gw.config.routes)
    arms = [arm.route for exp in gw.experiments.values() for arm in exp.arms]
    routes = [*gw.config.routes.values(), *arms]  # an arm may steer where its route does not
    steering = [r for r in routes if r.fallback.when is not FallbackWhen.NEVER]
    for route in steering:
        for name in route.fallbacks:
            if name not in gw.offers:
                gw.offers[name] = MoveOffers(gw.pools[name])
    if steering and gw.classifier is None:
        from classifier.model import load_default  # scikit-learn: only when needed

        gw.classifier = load_default()
        gw.classifier.predict("warm up")  # the first prediction pays numpy's start-up
