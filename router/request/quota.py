"""A limited key's request against its limits: refused early when a limit is reached
before its body is read (this process's book; nothing taken), then reserved with its
estimate once parsed, in Redis (`coordination.mode: redis`) or this process's book.

The estimate: the prompt's tokens (the gateway's generous estimate from the body's size)
plus the answer's: `max_tokens` when given, else DEFAULT_ANSWER_TOKENS (at most what the
primary's context window leaves), none for an embedding; its cost, those tokens at the
route's primary's price (a batch line's less its discount). Settled in
`router.request.accounting` with what it used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from policies.apis import Api
from policies.config import RouteConfig
from policies.limits.quotas import QuotaHold
from policies.pricing.costs import request_cost

if TYPE_CHECKING:
    from router.exchange import Exchange

DEFAULT_ANSWER_TOKENS = 4096  # the answer's estimate when a request sets no max_tokens


def precheck(ex: Exchange, key_id: str) -> None:
    """Refuse before the body is read when this process's book already would (local
    mode; in Redis mode the shared book decides once the request is parsed)."""
    if ex.gw.shared_quotas is None and (refusal := ex.gw.quotas.check(key_id)) is not None:
        raise ex.rejection(refusal.reason, refusal.retry_in_s, None, refusal.message)


def estimate(ex: Exchange, route: RouteConfig) -> tuple[int, float]:
    """The request's estimated tokens (prompt + answer) and cost on the route's primary."""
    parsed, prompt = ex.request_body, ex.prompt_tokens()
    backend = ex.config.backends[route.primary]
    if parsed.endpoint.api is Api.EMBEDDINGS:
        answer = 0
    elif parsed.max_tokens is not None:
        answer = parsed.max_tokens
    else:
        window = backend.context_window
        answer = DEFAULT_ANSWER_TOKENS if window is None else max(
            0, min(DEFAULT_ANSWER_TOKENS, window - prompt))
    slot_s = 0.0
    if backend.price is not None and backend.price.gpu_hour is not None:
        slot_s = ex.gw.backends[route.primary].clock.slot_s(answer)
    return prompt + answer, request_cost(backend.price, backend.slots, prompt, answer, slot_s,
                                         ex.batch)


async def reserve(ex: Exchange, key_id: str, route: RouteConfig) -> None:
    """Reserve the request's estimate against its key's limits, or refuse it (429, or
    503 when the shared book is away and fails closed)."""
    tokens, cost = estimate(ex, route)
    shared = ex.gw.shared_quotas
    if shared is not None:
        held = await shared.reserve(key_id, tokens, cost)
    else:
        held = ex.gw.quotas.reserve(key_id, tokens, cost)
    if held is None:
        return
    if not isinstance(held, QuotaHold):
        raise ex.rejection(held.reason, held.retry_in_s, None, held.message)
    ex.quota = held
    ex.rec.quota_held = True
