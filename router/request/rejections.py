"""The answers for requests the gateway refuses: each reason's status, message and code,
always with a `Retry-After`, and counted in `llm_rejection_total`."""

from __future__ import annotations

from policies.admission import RejectReason
from router.openai_api import ApiError
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
}


def rejection(metrics: Metrics, reason: RejectReason, retry_s: int, backend: str | None,
              message: str | None = None) -> ApiError:
    """The error for a refused request (`message` replaces the reason's default)."""
    metrics.rejections.add((backend or NO_BACKEND, reason.value))
    status, kind, default = _ANSWERS[reason]
    err = ApiError(status, message or default, kind, reason.value)
    err.headers.update({"Retry-After": str(retry_s), "x-slotgate-reject-reason": reason.value})
    return err
