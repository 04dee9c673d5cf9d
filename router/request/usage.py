"""A finished request's ledger row: its tokens, what it cost and what it would have cost
on its route's primary.

The counterfactual is exact when the primary served the request. Otherwise it prices
the same tokens at the primary's token prices, or, for a GPU-time-priced primary, the
slot time the primary has recently taken for an answer of that length. A batch line's
costs, both, are less the backend's `price.batch_discount`.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

from classifier.text import request_text
from policies.apis import Api
from policies.clock.clock import Clock
from policies.config import Config
from policies.pricing.costs import request_cost
from policies.scheduler.capabilities import estimate_tokens
from router.common.usage import Usage
from router.ledger.base import LedgerRow
from router.request.embeddings import input_text

if TYPE_CHECKING:
    from router.common.parsed import ParsedRequest
    from router.common.record import RequestRecord

CLIENT_CLOSED = 499  # the status a ledger row gets when the client left before the answer
# The margins an engine's usage is allowed over the gateway's own figures: a prompt of up to
# PROMPT_FACTOR times the body-size estimate (a tokenizer can spend a token per byte) plus
# room for the chat template, and per image; an answer up to max_tokens plus a little
# (engines count the stop token), else the backend's context window, else MAX_COMPLETION.
PROMPT_FACTOR = 4
PROMPT_SLACK = 1024
IMAGE_TOKENS = 16_384
COMPLETION_SLACK = 16
MAX_COMPLETION = 1_000_000


def bounded_usage(prompt_estimate: int, max_tokens: int | None, images: bool,
                  context_window: int | None) -> Usage:
    """An attempt's usage, accepting what an engine may report for its request: a prompt
    within a margin of the gateway's estimate, an answer within max_tokens."""
    prompt = PROMPT_FACTOR * prompt_estimate + PROMPT_SLACK + (IMAGE_TOKENS if images else 0)
    if max_tokens is not None:
        completion = max_tokens + COMPLETION_SLACK
    else:
        completion = context_window if context_window is not None else MAX_COMPLETION
    return Usage(max_prompt=prompt, max_completion=completion)


def ledger_row(rec: RequestRecord, config: Config,
               primary_clock: Clock | None) -> LedgerRow:
    """`primary_clock`: the route's primary's, for how long it holds a slot by answer
    length."""
    prompt = rec.prompt_tokens or 0
    completion = rec.completion_tokens or 0
    cost = counterfactual = 0.0
    # .get: a reload may have removed the backend while the request ran (then: unpriced)
    backend = config.backends.get(rec.backend) if rec.backend is not None else None
    if backend is not None and rec.slot_at is not None:  # it held a slot
        cost = request_cost(backend.price, backend.slots, prompt, completion, rec.slot_ms / 1000,
                            rec.batch)
        primary = config.backends.get(rec.primary) if rec.primary is not None else None
        if rec.primary == rec.backend:
            counterfactual = cost
        elif primary is not None:
            slot_s = (primary_clock.slot_s(completion) if primary_clock is not None
                      else primary.initial_hold_s)
            counterfactual = request_cost(primary.price, primary.slots, prompt, completion,
                                          slot_s, rec.batch)
    status = rec.status or (CLIENT_CLOSED if rec.disconnect is not None else 0)
    disconnect = rec.disconnect
    # The record's fields read by two C calls, in the table's column order; the row made
    # as a tuple is (no keyword matching of a NamedTuple's 34 arguments).
    return _new_row(LedgerRow, (
        *_LEADING(rec), status, rec.error, None if disconnect is None else disconnect._value_,
        float(rec.queue_wait_ms), rec.ttft_ms, float(rec.total_ms), float(rec.slot_ms),
        prompt, completion, rec.tokens_estimated, cost, counterfactual, *_TRAILING(rec)))


_LEADING = attrgetter("row_id", "ts", "request_id", "endpoint", "route", "primary",
                      "experiment", "arm", "tenant", "backend", "reason", "intent",
                      "p_simple", "stream")
_TRAILING = attrgetter("key_id", "replica", "priority", "slo_ttft_ms", "predicted_ttft_ms",
                       "api", "usage_rejected", "batch")
_new_row = tuple.__new__


def count_tokens(rec: RequestRecord, parsed: ParsedRequest, usage: Usage) -> None:
    """The backend's usage, or the gateway's estimate (marked) when it gave none or gave
    counts out of bounds (then also flagged `usage_rejected`)."""
    rec.usage_rejected = usage.rejected
    if usage.known and not usage.rejected:
        rec.prompt_tokens = usage.prompt_tokens
        rec.completion_tokens = usage.completion_tokens
        rec.cached_tokens = usage.cached_tokens
        return
    rec.tokens_estimated = True
    text = (input_text(parsed.body.get("input")) if parsed.endpoint.api is Api.EMBEDDINGS
            else request_text(parsed.body))
    rec.prompt_tokens = estimate_tokens(len(text), len(text.encode(errors="replace")))
    rec.completion_tokens = usage.seen_events if parsed.stream else usage.completion_tokens
