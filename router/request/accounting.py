"""What a finished request leaves behind: its metrics, its place among the recent
requests, what it taught the slot-time model, its key's quota settled and its ledger row.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from policies.failures import FailureKind
from policies.pricing import SlotTimeModel
from router.request.usage import ledger_row

if TYPE_CHECKING:
    from policies.config import Config
    from policies.quotas import Quotas
    from router.ledger.base import Ledger
    from router.record import RequestRecord
    from router.telemetry.metrics import Metrics


class HasSlotTime(Protocol):
    @property
    def slot_time(self) -> SlotTimeModel: ...


class Books(Protocol):
    """Where a request is accounted for (the gateway)."""

    @property
    def config(self) -> Config: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def recent(self) -> deque[RequestRecord]: ...
    @property
    def quotas(self) -> Quotas: ...
    @property
    def ledger(self) -> Ledger | None: ...
    @property
    def backends(self) -> Mapping[str, HasSlotTime]: ...


def settle(books: Books, rec: RequestRecord, callers_known: bool,
           failed: FailureKind | None = None) -> None:
    """Account for a finished request (`failed`: how its upstream exchange failed;
    `callers_known`: auth is on, so a request without a key id was refused unknown)."""
    books.metrics.record(rec, rec.primary, failed)
    if callers_known and rec.key_id is None:
        # Refused before its caller was known: counted, and nothing else kept (no
        # ledger row; a flood of them must not push real requests out of `recent`).
        return
    books.recent.append(rec)
    backend = books.backends.get(rec.backend) if rec.backend is not None else None
    if backend is not None and rec.status == 200 and not rec.tokens_estimated:
        backend.slot_time.observe(rec.completion_tokens or 0, rec.slot_ms / 1000)
    if books.ledger is None and not rec.quota_held:
        return
    primary = books.backends.get(rec.primary) if rec.primary is not None else None
    row = ledger_row(rec, books.config, primary.slot_time if primary is not None else None)
    if rec.quota_held and rec.key_id is not None:
        books.quotas.finish(rec.key_id, row.prompt_tokens + row.completion_tokens, row.cost)
    if books.ledger is not None:
        books.ledger.add(row)
        if row.cost and row.backend is not None:
            books.metrics.add_cost(row.backend, books.config.currency, row.cost)
