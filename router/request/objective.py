"""A request's time-to-first-token objective and forecast on its record, and its verdict.

`assign` sets the objective once the route is known; `predict` sets the forecast when
the request is first admitted (the one place it is made: the backend's answer model says
how soon a slot gives a first byte, `policies.clock.ttft` how a prediction is made, so a better
queue forecast changes only what is passed in here); `first_token` judges it when its
first byte arrives, `settle` when it ends without one (see `policies.clock.slo` for the rule).
Each request is judged at most once. Nothing is learnt at the first byte: the answer
model learns a stream's first-token time from the same span when the answer ends
(`accounting.learn`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from policies.clock.slo import objective_s, verdict
from policies.clock.ttft import first_byte_s, predict_ttft_s
from policies.config import Config, Priority, RouteConfig

if TYPE_CHECKING:
    from router.backend import Backend
    from router.common.record import RequestRecord
    from router.telemetry.metrics import Metrics


def assign(rec: RequestRecord, config: Config, route: RouteConfig, priority: Priority) -> None:
    rec.slo_ttft_ms = objective_s(config, route, priority) * 1000


def predict(rec: RequestRecord, backend: Backend, wait_s: float,
            max_tokens: int | None) -> None:
    """The TTFT forecast of a request admitted on `backend` (`wait_s`: its forecast wait
    for a slot, 0 when it took one at once); a retry keeps its first forecast."""
    if rec.predicted_ttft_ms is not None:
        return
    elapsed_s = time.perf_counter() - rec.started_at
    slot_to_byte_s = expected_first_byte_s(backend, rec.stream, max_tokens)
    rec.predicted_ttft_ms = predict_ttft_s(elapsed_s, wait_s, slot_to_byte_s) * 1000


def expected_first_byte_s(backend: Backend, stream: bool, max_tokens: int | None) -> float:
    """Seconds from a slot on `backend` to the first byte of a new answer."""
    return first_byte_s(backend.clock.answers, stream, max_tokens,
                        lambda: backend.clock.holds.mean_s)  # (the pools' own, no snapshot)


def first_token(rec: RequestRecord, metrics: Metrics, at: float) -> None:
    """Its first byte came at `at` (perf_counter): record, judge and count."""
    rec.ttft_ms = (at - rec.started_at) * 1000
    if rec.slo_met is None:
        judged = verdict(rec.slo_ttft_ms, rec.ttft_ms, rec.ttft_ms, client_left=False)
        if judged is not None:
            rec.slo_met = metrics.judged(rec, judged)


def settle(rec: RequestRecord, metrics: Metrics) -> None:
    """At its end: a request not yet judged (no first token) is judged now."""
    if rec.slo_met is not None or rec.slo_ttft_ms is None:  # judged, or no objective
        return
    judged = verdict(rec.slo_ttft_ms, rec.ttft_ms, rec.total_ms,
                     client_left=rec.disconnect is not None)
    if judged is not None:
        rec.slo_met = metrics.judged(rec, judged)
