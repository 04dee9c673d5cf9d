"""Drain before removal (#34): `POST /admin/replicas/{name}/drain` takes a replica out of
its group as a reload that removed it would (router.backend.Backend.change): no new work
goes to it, what it runs finishes, its slots leave the pool. `GET /admin/replicas/{name}`
says how many requests it still holds, so a scale-down (a preStop hook) waits until it
holds none and never cuts an answer. A reload that keeps the replica in the config brings
it back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from router.common.errors import ApiError

if TYPE_CHECKING:
    from router.backend import Backend
    from router.gateway import Gateway


def drain(gw: Gateway, name: str) -> dict[str, Any]:
    backend = _backend_of(gw, name)
    live = [n for n, r in backend.replicas.items() if not r.retired]
    if live == [name]:
        raise ApiError(409, f"Replica '{name}' is the last of backend '{backend.name}' in "
                       "service: draining it would leave nothing to serve the line.",
                       code="last_replica")
    backend.drained.add(name)
    backend.replicas[name].retired = True
    wanted = {e.name: e.slots for e in backend.config.replicas(backend.name)
              if e.name is not None and not backend.replicas[e.name].retired}
    backend.pool.resize(sum(wanted.values()), backend.config.queue_limit, wanted)
    return state(gw, name)


def state(gw: Gateway, name: str) -> dict[str, Any]:
    """A replica's standing: draining, and the requests it still holds."""
    backend = _backend_of(gw, name)
    holding = next((s.active for s in backend.pool.seats() if s.name == name), 0)
    draining = backend.replicas[name].retired
    return {"replica": name, "backend": backend.name, "draining": draining,
            "holding": holding, "drained": draining and holding == 0}


def _backend_of(gw: Gateway, name: str) -> Backend:
    for backend in gw.backends.values():
        if name in backend.replicas:
            return backend
    raise ApiError(404, f"No replica is named '{name}'.", code="replica_not_found")
