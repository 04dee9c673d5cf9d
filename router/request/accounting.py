"""What a finished request leaves behind: its metrics, its place among the recent
requests, what it taught the slot-time and answer models, its key's quota settled and its
ledger row.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from policies.apis import GENERATIVE_APIS
from policies.clock.answers import AnswerModel
from policies.health.failures import FailureKind
from policies.pricing.costs import SlotTimeModel
from router.common.record import Phase
from router.request.usage import ledger_row

if TYPE_CHECKING:
    from policies.config import Config
    from policies.limits.quotas import QuotaHold, Quotas
    from policies.slots.limits import SharedQuotas
    from router.common.record import RequestRecord
    from router.ledger.base import Ledger
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
    def shared_quotas(self) -> SharedQuotas | None: ...
    @property
    def ledger(self) -> Ledger | None: ...
    @property
    def backends(self) -> Mapping[str, HasSlotTime]: ...


def learn(answers: AnswerModel, rec: RequestRecord, max_tokens: int | None) -> None:
    """What an answer just ended on its slot teaches its backend's answer model: its
    length (cut short: at least that), and for a stream its first-token time and rate."""
    if rec.completion_tokens is None or rec.slot_at is None:
        return  # no answer began
    if rec.phase is Phase.DONE:
        cut = False
    elif rec.phase is Phase.STREAMING:
        cut = True  # its client left, or the engine dropped it: it ran at least this long
    else:
        return
    ttft_s = None
    if rec.stream and rec.ttft_ms is not None:
        ttft_s = rec.ttft_ms / 1000 - (rec.slot_at - rec.started_at)
    answers.observe(rec.completion_tokens, max_tokens, cut, ttft_s, rec.slot_ms / 1000)


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
    backend = books.backends.get(rec.backend) if rec.backend is not None else None
    if (backend is not None and rec.status == 200 and not rec.tokens_estimated
            and rec.api in GENERATIVE_APIS):  # an embedding's slot time is no answer's
        backend.slot_time.observe(rec.completion_tokens or 0, rec.slot_ms / 1000)
    if books.ledger is None and quota is None:
        return
    primary = books.backends.get(rec.primary) if rec.primary is not None else None
    row = ledger_row(rec, books.config, primary.slot_time if primary is not None else None)
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
