"""Each busy pool's split between tenants, for the dashboard: the tokens each tenant was
served there over the last stretch of time (from the gateway's recent records) and the
requests it has waiting (from its pool, when the pool can tell).

A tenant is named as in the metrics (`Metrics.tenant_label`: a configured key's tenant,
else "other"), so the table is bounded by the config. Reads only; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from router.common.record import RequestRecord

TenantRow = dict[str, object]  # {"tenant", "tokens", "share", "waiting"}


@runtime_checkable
class TenantWaiters(Protocol):
    """A pool that knows its waiters' tenants (a local one; a shared one sees only its own)."""

    def tenants(self) -> Mapping[str, int]: ...  # waiting requests by tenant


def waiting(pool: object) -> Mapping[str, int] | None:
    """Its waiters by tenant; None when the pool cannot tell (one shared through Redis)."""
    return pool.tenants() if isinstance(pool, TenantWaiters) else None


def tenant_shares(recent: Sequence[RequestRecord], busy: Mapping[str, object],
                  label: Callable[[str | None], str], since: float
                  ) -> dict[str, list[TenantRow]]:
    """For each pool of `busy` (name -> pool), its tenants, most tokens first: the tokens
    served by requests that ended after `since` (perf_counter seconds; `recent` newest
    last), their share of the pool's, and the requests waiting (None: not known)."""
    tokens: dict[str, dict[str, int]] = {name: {} for name in busy}
    for rec in reversed(recent):
        if rec.started_at + rec.total_ms / 1000 < since:
            break
        served = tokens.get(rec.backend or "")
        if served is not None and rec.prompt_tokens is not None:
            tenant = label(rec.tenant)
            served[tenant] = (served.get(tenant, 0) + rec.prompt_tokens
                              + (rec.completion_tokens or 0))
    out: dict[str, list[TenantRow]] = {}
    for name, pool in busy.items():
        waiters: dict[str, int] | None = None
        if (told := waiting(pool)) is not None:
            waiters = {}
            for tenant, count in told.items():
                waiters[label(tenant)] = waiters.get(label(tenant), 0) + count
        served = tokens[name]
        total = sum(served.values())
        names = sorted(served.keys() | (waiters or {}).keys(),
                       key=lambda t: (-served.get(t, 0), t))
        out[name] = [{"tenant": t, "tokens": served.get(t, 0),
                      "share": round(served.get(t, 0) / total, 4) if total else None,
                      "waiting": None if waiters is None else waiters.get(t, 0)}
                     for t in names]
    return out
