"""The series one served request updates, looked up once per kind of request and kept.

A kind is what the labels of those series are made of: the route, the backend and its
replica, the client API, the status and the tenant's label. The first request of a kind
resolves its counters' cells and its histograms' series (router/telemetry/tallies.py);
every later one adds to them directly, with no label tuple built and hashed per series.
The kinds are bounded by the config (the tenant is its label, not the caller's key), and
the table is emptied when the config changes the series (`Metrics.configure`) or grows
past `MAX_KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.telemetry.tallies import Spread, Tally

MAX_KINDS = 4096
Kind = tuple[str | None, str, str | None, str, int, str | None]


@dataclass(slots=True)
class Served:
    """One kind's series (None: the kind updates no such series)."""

    requests: list[float] | None  # None for a status of 0 (no answer was given)
    ttft: list[float]
    tokens_in: list[float]
    tokens_out: list[float]
    replica_requests: list[float] | None
    replica_ttft: list[float] | None
    tenant_tokens: list[float] | None
    tenant_wait: list[float] | None


@dataclass(slots=True)
class Families:
    """The families a served request updates (the `Metrics` attributes of these names)."""

    requests: Tally
    ttft: Spread
    tokens: Tally
    replica_requests: Tally
    replica_ttft: Spread
    tenant_tokens: Tally
    tenant_wait: Spread

    def served(self, kind: Kind) -> Served:
        route, backend, replica, api, status, tenant = kind
        status_class = f"{status // 100}xx"
        on_replica = replica is not None
        by_tenant = tenant is not None
        return Served(
            self.requests.cell((route or "unknown", backend, status_class, api))
            if status else None,
            self.ttft.series((backend, api)),
            self.tokens.cell((backend, "in")), self.tokens.cell((backend, "out")),
            self.replica_requests.cell((backend, replica or "", status_class))
            if on_replica and status else None,
            self.replica_ttft.series((backend, replica or "")) if on_replica else None,
            self.tenant_tokens.cell((backend, tenant or "")) if by_tenant else None,
            self.tenant_wait.series((backend, tenant or "")) if by_tenant else None)
