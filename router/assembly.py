"""Putting a gateway together from its config: each backend (`router.backend`), then what
the routes need (experiments, move offers, the classifier).

Used at startup and again by a config reload, which adds only what is new.
"""

from __future__ import annotations

import asyncio

from policies.config import BackendConfig, FallbackWhen
from policies.pricing.experiments import build_experiments
from policies.slots.handover import MoveOffers
from router.backend import Backend, open_backend
from router.common.errors import ApiError
from router.gateway import Gateway
from router.upstream.errors import UpstreamError
from router.upstream.proxy import Upstream

_MODELS_LIMIT = 1024 * 1024  # a health check reads at most this much of /v1/models


async def add_backend(gw: Gateway, name: str, config: BackendConfig) -> None:
    """The backend, watched (`watch`)."""
    backend = gw.backends[name] = await open_backend(name, config, gw.config.coordination,
                                                     gw.coordinator)
    watch(gw, backend)


def watch(gw: Gateway, backend: Backend) -> None:
    """The backend watched by the metrics (its series kept on it) and the health checks:
    its breaker, and one for each replica of a group (a group of one has the backend's
    alone). Again after a reload changed it: it may have become a group, and its breakers'
    settings and counts start anew."""
    name, config = backend.name, backend.config
    backend.series = gw.metrics.watch(backend.pool)
    backend.breaker = gw.health.add(name, config)
    if backend.grouped:
        for replica in backend.replicas.values():
            if not replica.retired:
                replica.breaker = gw.replica_health.add(name, replica.name, config,
                                                        backend.pool)


async def health_check(gw: Gateway, name: str) -> bool:
    """Does a replica of the backend answer GET /v1/models with 200 within its connect
    timeout? (The breaker is the group's: one live replica keeps it serving.)"""
    for replica in list(gw.backends[name].replicas.values()):
        if not replica.retired and await _answers(replica.upstream):
            return True
    return False


async def replica_check(gw: Gateway, name: str, replica: str) -> bool:
    """Does this replica answer GET /v1/models with 200 within its connect timeout?"""
    return await _answers(gw.backends[name].replicas[replica].upstream)


async def _answers(upstream: Upstream) -> bool:
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
            return bool(resp.status == 200)
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
            backend = gw.backends[name]
            if backend.offers is None:
                backend.offers = MoveOffers(backend.pool)
    if steering and gw.classifier is None:
        from classifier.model import load_default  # scikit-learn: only when needed

        gw.classifier = load_default()
        gw.classifier.predict("warm up")  # the first prediction pays numpy's start-up
