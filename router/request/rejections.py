"""The answers for requests the gateway refuses: each reason's status, message and code,
always with a `Retry-After` (the one clamp: `server.retry_after_min_s` to
`retry_after_max_s`), the `x-slotgate-reject-reason` header, and counted in
`llm_rejection_total`. Every refusal of the gateway's own comes through `rejection`
(tests/test_rejections.py walks them); what an engine refused is relayed as it said."""

from __future__ import annotations

import math

from policies.config import ServerConfig
from policies.scheduler.admission import RejectReason
from router.common.errors import ApiError
from router.telemetry.metrics import NO_BACKEND, Metrics

_ANSWERS: dict[RejectReason, tuple[int, str, str]] = {
    RejectReason.QUEUE_FULL: (
        429, "rate_limit_error", "All slots and queues for this model are full; retry later."),
    RejectReason.SHED: (
        429, "rate_limit_error", "A higher-priority request took this request's place in the "
        "full queue; retry later."),
    RejectReason.OBJECTIVE: (
        429, "rate_limit_error", "This model cannot start a sheddable request within its "
        "time-to-first-token objective now; retry after the time given."),
    RejectReason.QUEUE_TIMEOUT: (
        503, "server_error", "Timed out waiting in the queue for a free slot; retry later."),
    RejectReason.DRAINING: (
        503, "server_error", "The gateway is shutting down; retry (another replica will "
        "answer)."),
    RejectReason.UNAVAILABLE: (
        503, "server_error", "The shared slot pool is unavailable (its Redis cannot be "
        "reached); retry later."),
    RejectReason.BODY_BYTES: (
        503, "server_error", "The gateway holds as many request bodies as it may; retry "
        "shortly."),
    RejectReason.CONCURRENCY: (429, "rate_limit_error", "Too many requests at once."),
    RejectReason.BUDGET: (429, "insufficient_quota", "This key's budget is used up."),
    RejectReason.RATE_LIMIT: (429, "rate_limit_error", "This key's rate limit is reached."),
    RejectReason.BACKEND_UNAVAILABLE: (
        503, "server_error", "This model's backend is unavailable and so are its route's "
        "fallbacks; retry later."),
    RejectReason.SLOT_LOST: (
        503, "server_error", "This request's slot lease was lost (the gateway could not "
        "renew it in Redis within its TTL); retry."),
    RejectReason.SHUTDOWN: (
        503, "server_error", "The gateway shut down before this answer was complete; retry."),
    RejectReason.SUBSCRIBERS: (
        503, "server_error", "Too many dashboards are connected; retry later."),
    RejectReason.WARMUP: (
        503, "server_error", "No replica of this model became ready within its warm-up "
        "time; retry later."),
    RejectReason.CONNECTIONS: (
        503, "server_error", "The gateway has too many open connections; retry shortly."),
}


def retry_after_s(after_s: float, server: ServerConfig) -> int:
    """The one Retry-After: whole seconds until `after_s` (a forecast, a breaker's
    reopening, a limit's refill), within the server's floor and cap."""
    if not math.isfinite(after_s):
        return server.retry_after_max_s
    return max(server.retry_after_min_s, min(server.retry_after_max_s, math.ceil(after_s)))


def rejection(metrics: Metrics, server: ServerConfig, reason: RejectReason, after_s: float,
              backend: str | None, message: str | None = None) -> ApiError:
    """The error for a refused request, `after_s` from now worth a retry (`message`
    replaces the reason's default), counted."""
    metrics.rejections.add((backend or NO_BACKEND, reason.value))
    return answer(server, reason, after_s, message)


def answer(server: ServerConfig, reason: RejectReason, after_s: float,
           message: str | None = None) -> ApiError:
    """The refusal's answer alone: for the connection guard, which builds its answers once
    and sends them before any request is read (so counts none)."""
    status, kind, default = _ANSWERS[reason]
    err = ApiError(status, message or default, kind, reason.value)
    err.headers.update({"Retry-After": str(retry_after_s(after_s, server)),
                        "x-slotgate-reject-reason": reason.value})
    return err
