"""What a finished request leaves behind: what it taught its backend's clock (when it let
its slot go: `answered`), then its metrics, its place among the recent requests, its
key's quota settled and its ledger row.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from policies.clock.clock import Answered, Clock
from policies.health.failures import FailureKind
from router.common.record import Phase
from router.request.usage import ledger_row

if TYPE_CHECKING:
    from policies.config import Config
    from policies.limits.quotas import QuotaHold, Quotas
    from policies.slots.limits import SharedQuotas
    from router.common.record import RequestRecord
    from router.ledger.base import Ledger
    from router.telemetry.metrics import Metrics


class HasClock(Protocol):
    @property
    def clock(self) -> Clock: ...


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
    def shared_quotas(self) -> SharedQuotas | None: ...
    @property
    def ledger(self) -> Ledger | None: ...
    @property
    def backends(self) -> Mapping[str, HasClock]: ...


def answered(rec: RequestRecord, held_s: float, max_tokens: int | None,
             generative: bool) -> Answered:
    """What a request that just let its slot go tells its backend's clock: its hold; for
    an answer (`generative`: an embedding is none), its length (cut short: at least
    that), for a stream its first-token time and, where the engine reported its cached
    prompt tokens, the tokens it prefilled; a whole answer counted by the engine is a
    sample of slot time by length."""
    if not generative or rec.completion_tokens is None or rec.slot_at is None:
        return Answered(held_s, max_tokens)  # no answer began
    if rec.phase is Phase.DONE:
        cut = False
    elif rec.phase is Phase.STREAMING:
        cut = True  # its client left, or the engine dropped it: it ran at least this long
    else:
        return Answered(held_s, max_tokens)
    ttft_s = prefilled = None
    if rec.stream and rec.ttft_ms is not None:
        ttft_s = rec.ttft_ms / 1000 - (rec.slot_at - rec.started_at)
        if rec.cached_tokens is not None and rec.prompt_tokens is not None:
            prefilled = max(0, rec.prompt_tokens - rec.cached_tokens)
    return Answered(held_s, max_tokens, rec.completion_tokens, cut, ttft_s,
                    whole=not cut and not rec.tokens_estimated, prefilled=prefilled)


def settle(books: Books, rec: RequestRecord, callers_known: bool,
           failed: FailureKind | None = None, quota: QuotaHold | None = None,
           kept: bool = True) -> None:
    """Account for a finished request (`failed`: how its upstream exchange failed;
    `callers_known`: auth is on, so a request without a key id was refused unknown;
    `quota`: its reservation against its key's limits, given back here on every path;
    `kept`: false for a key's refusal that its sampling leaves out of the ledger)."""
    books.metrics.record(rec, rec.primary, failed)
    if callers_known and rec.key_id is None:
        # Refused before its caller was known: counted, and nothing else kept (no
        # ledger row; a flood of them must not push real requests out of `recent`).
        return
    if not kept:  # likewise a flood of one key's refusals; its reservation is given back
        if quota is not None:
            (books.shared_quotas or books.quotas).settle(quota, 0, 0.0)
        return
    books.recent.append(rec)
    if books.ledger is None and quota is None:
        return
    primary = books.backends.get(rec.primary) if rec.primary is not None else None
    row = ledger_row(rec, books.config, primary.clock if primary is not None else None)
    if quota is not None:
        used = row.prompt_tokens + row.completion_tokens
        if books.shared_quotas is not None:
            books.shared_quotas.settle(quota, used, row.cost)
        else:
            books.quotas.settle(quota, used, row.cost)
    if books.ledger is not None:
        books.ledger.add(row)
        if row.cost and row.backend is not None:
            books.metrics.add_cost(row.backend, books.config.currency, row.cost)
