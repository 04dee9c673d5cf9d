"""Drain before removal (#34): `POST /admin/replicas/{name}/drain` takes a replica out of
its group as a reload that removed it would (router.backend.Backend.change): no new work
goes to it, what it runs finishes, its slots leave the pool. `GET /admin/replicas/{name}`
says how many requests it still holds, so a scale-down (a preStop hook) waits until it
holds none and never cuts an answer. A reload that keeps the replica in the config brings
it back.

With Redis coordination a drain is the fleet's (router/fleet/shared_drains.py): every
gateway sharing it drains the replica too, and `holding` counts the requests every gateway
holds on it (the shared pool's seats); `scope` says "fleet", or "gateway" while Redis does
not answer (then `drained` stays false: the others' holders are not known)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from router.common.errors import ApiError
from router.fleet.replicas import is_last, retire

if TYPE_CHECKING:
    from router.backend import Backend
    from router.gateway import Gateway


async def drain(gw: Gateway, name: str) -> dict[str, Any]:
    backend = _backend_of(gw, name)
    if is_last(backend, name):
        raise ApiError(409, f"Replica '{name}' is the last of backend '{backend.name}' in "
                       "service: draining it would leave nothing to serve the line.",
                       code="last_replica")
    retire(backend, name)
    if gw.drains is not None:
        await gw.drains.spread(backend.name, name)
    return await state(gw, name)


async def state(gw: Gateway, name: str) -> dict[str, Any]:
    """A replica's standing: draining, and the requests it still holds (every gateway's,
    with Redis)."""
    backend = _backend_of(gw, name)
    holding = next((s.active for s in backend.pool.seats() if s.name == name), 0)
    scope = "gateway"
    if gw.drains is not None:
        fleet = await gw.drains.holding(backend, name)
        if fleet is not None:
            holding, scope = fleet, "fleet"
    draining = backend.replicas[name].retired
    known = gw.drains is None or scope == "fleet"  # with Redis away the others' are not
    return {"replica": name, "backend": backend.name, "draining": draining,
            "holding": holding, "drained": draining and holding == 0 and known,
            "scope": scope}


def _backend_of(gw: Gateway, name: str) -> Backend:
    for backend in gw.backends.values():
        if name in backend.replicas:
            return backend
    raise ApiError(404, f"No replica is named '{name}'.", code="replica_not_found")
