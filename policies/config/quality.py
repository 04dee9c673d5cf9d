"""The `quality` section and a route's `quality`: shadow comparisons that measure what a
downgrade costs. A sample of the requests a route moved to its small model is replayed on
its primary in a slot nobody wants, and a judge compares the two answers (#33).

Pure data and validation.
"""

from __future__ import annotations

from pydantic import Field

from policies.config.base import StrictModel


class RouteQualityConfig(StrictModel):
    # The share of the requests this route moves to a small model that are replayed on
    # its primary and judged (0: none). Each replay and judgement runs only in slots no
    # interactive request wants, and gives them up to one at once.
    shadow_rate: float = Field(default=0.0, ge=0.0, le=1.0)


class QualityConfig(StrictModel):
    # The route that judges (its primary answers the judge's prompt); None: each route's
    # own primary.
    judge_route: str | None = Field(default=None, min_length=1, max_length=200)
    # Keep the question and both answers with each verdict (ledger table verdict_texts),
    # to read what the judge read. Off: they live in memory until the judge has spoken.
    keep_texts: bool = False
    # Tenants whose requests are never replayed.
    opt_out_tenants: frozenset[str] = Field(default=frozenset(), max_length=10_000)
    # Replays and judgements waiting for an idle slot, in memory; more are skipped.
    max_pending: int = Field(default=64, ge=1, le=10_000)
    # Tokens (prompt and answer, replay and judge) spent on shadows per hour, in all and
    # for one tenant's requests; past either, further shadows are skipped.
    max_tokens_per_hour: int = Field(default=500_000, ge=0, le=10**12)
    max_tenant_tokens_per_hour: int = Field(default=100_000, ge=0, le=10**12)
    # The longest a shadow may wait for its idle slots before it is dropped.
    max_wait_s: float = Field(default=600.0, gt=0, le=86_400)
