"""A request's time-to-first-token objective and forecast on its record, and its verdict.

`assign` sets the objective once the route is known; `predict` sets the forecast when
the request is first admitted (the one place it is made: `policies.ttft` holds the
model, so a better queue forecast changes only what is passed in here); `first_token`
judges it when its first byte arrives, `settle` when it ends without one (see
`policies.slo` for the rule). Each request is judged at most once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from policies.config import Config, Priority, RouteConfig
from policies.slo import objective_s, verdict
from policies.ttft import predict_ttft_s

if TYPE_CHECKING:
    from router.backend import Backend
    from router.record import RequestRecord
    from router.telemetry.metrics import Metrics


def assign(rec: RequestRecord, config: Config, route: RouteConfig, priority: Priority) -> None:
    rec.slo_ttft_ms = objective_s(config, route, priority) * 1000


def predict(rec: RequestRecord, backend: Backend, wait_s: float) -> None:
    """The TTFT forecast of a request admitted on `backend` (`wait_s`: its forecast wait
    for a slot, 0 when it took one at once); a retry keeps its first forecast."""
    if rec.predicted_ttft_ms is not None:
        return
    elapsed_s = time.perf_counter() - rec.started_at
    first_byte_s = backend.first_byte.expect(rec.stream)
    rec.predicted_ttft_ms = predict_ttft_s(elapsed_s, wait_s, first_byte_s) * 1000


def first_token(rec: RequestRecord, backend: Backend, metrics: Metrics, at: float) -> None:
    """Its first byte came at `at` (perf_counter): record, learn, judge and count."""
    rec.ttft_ms = (at - rec.started_at) * 1000
    if rec.slot_at is not None:
        backend.first_byte.observe(rec.stream, at - rec.slot_at)
    if rec.slo_met is None:
        judged = verdict(rec.slo_ttft_ms, rec.ttft_ms, rec.ttft_ms, client_left=False)
        if judged is not None:
            rec.slo_met = metrics.judged(rec, judged)


def settle(rec: RequestRecord, metrics: Metrics) -> None:
    """At its end: a request not yet judged (no first token) is judged now."""
    if rec.slo_met is not None:
        return
    judged = verdict(rec.slo_ttft_ms, rec.ttft_ms, rec.total_ms,
                     client_left=rec.disconnect is not None)
    if judged is not None:
        rec.slo_met = metrics.judged(rec, judged)
