"""A replica's drain on one gateway (#34): out of its pool's offer, its streams running
out. Asked by an admin (router/fleet/drain.py) or by another gateway through Redis
(router/fleet/shared_drains.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from router.backend import Backend


def is_last(backend: Backend, name: str) -> bool:
    """Is `name` the only replica of the backend still in service?"""
    return [n for n, r in backend.replicas.items() if not r.retired] == [name]


def retire(backend: Backend, name: str) -> None:
    """This gateway's drain: the replica out of the pool's offer, its streams run out."""
    if name in backend.drained and backend.replicas[name].retired:
        return  # drained already
    backend.drained.add(name)
    backend.replicas[name].retired = True
    wanted = {e.name: e.slots for e in backend.config.replicas(backend.name)
              if e.name is not None and e.name in backend.replicas
              and not backend.replicas[e.name].retired}
    backend.pool.resize(sum(wanted.values()), backend.config.queue_limit, wanted)
