"""The cost report of `slotgate report`: what a routing policy cost, saved and made people wait.

`build_report` turns ledger rows into one plain, JSON-able dict (str, int, float, None,
list, dict); `router.report.render` prints it as text, CSV, JSON or an HTML page.

Groups: the whole ledger ("total"), each experiment arm (rows without one: "(none)"; batch
rows, shadows included, are in no arm while an experiment runs), and each backend within an
arm (rows that never got a backend: "(none)").
For every group, over its rows:

- served: the row got a backend (`backend is not None`) and status 200.
- fallback_share: served rows whose backend is not the route's primary
  (`backend != primary`) divided by served rows; None when nothing was served.
- rate_429: status == 429.  timeout_rate: error is "queue_timeout" or "upstream_timeout".
- error_rate: status >= 500, the timeouts above excluded.  disconnect_rate: status == 499.
  These four are fractions of all the group's rows (`requests`).
- cost, counterfactual_cost (the same requests all on their primaries), saving
  (counterfactual - cost) and saving_pct (saving in % of the counterfactual, None when 0);
  cost_per_request = cost / requests, cost_per_1k = 1000 * cost / requests.
- queue wait: over the rows that reached a backend's pool, i.e. `backend is not None` and
  error != "queue_full" (rejected at once, never queued). Rows that waited and then timed
  out, or whose client left while queued, count with the time they waited.
- ttft: over the rows with `ttft_ms` set.  estimated_share: rows with `tokens_estimated`.

Replicas: when some backend's rows name more than one replica (the engine of the backend's
group that served them), "replicas" lists every backend of the rows (all arms together) with
its figures and, within it, each replica's, whose `share` is its part of the backend's
requests. Rows of a backend that reached no engine (rejected or timed out in the queue, or
written before the ledger kept the replica) form the replica "(none)". With one engine per
backend the key is absent, so such a report is the same as before the ledger kept replicas.

Client APIs: "apis" (router/report/apis.py), each API's figures, when the rows hold several.

Tenants: "tenants" holds each backend's split between tenants and Jain's fairness index
over it (router/report/tenants.py), absent when no row has a tenant.

Batch work: "batch" holds each tenant's batch tokens and cost and each backend's batch
slot time and the idle capacity it filled (router/report/batch.py), when some row is one.
The quality of downgrades: "quality" (router/report/quality.py), given verdicts.

TTFT objectives: "slo" holds each arm's and each class's attainment (router/report/slo.py
defines it), absent when no row has an objective.

Quantiles are numpy's "linear" method (Hyndman & Fan type 7, R's default) everywhere, inside
the bootstrap too. Comparisons of each arm with the baseline arm use a 95 % percentile
bootstrap: each arm's rows are resampled independently, with a fresh
`numpy.random.default_rng(seed)` per comparison, so no figure depends on the other arms.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from math import fsum
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from policies.health.failures import FailureKind, code
from policies.scheduler.admission import RejectReason
from router.ledger.base import LedgerRow
from router.report.apis import api_breakdown
from router.report.batch import batch_breakdown
from router.report.quality import QualityInputs, quality_breakdown
from router.report.slo import slo_breakdown
from router.report.tenants import tenant_breakdown

NONE_GROUP = "(none)"
QUANTILE_METHOD: Final = "linear"
CI_LEVEL = 0.95
# The ledger's error codes of a wait that ran out: the queue's, or the backend's timeouts.
TIMEOUT_ERRORS = frozenset({RejectReason.QUEUE_TIMEOUT.value, code(FailureKind.FIRST_BYTE_TIMEOUT),
                            code(FailureKind.IDLE_TIMEOUT)})
_CHUNK_CELLS = 2_000_000  # bootstrap cells (resamples x rows) drawn at once: ~16 MB of float64

Floats = NDArray[np.float64]
Statistic = Callable[[Floats], Floats]  # a (k, n) matrix of resamples -> k statistics


def build_report(
    rows: Sequence[LedgerRow],
    *,
    currency: str = "USD",
    baseline: str | None = None,
    resamples: int = 2000,
    seed: int = 0,
    buckets: int = 20,
    weights: Mapping[str, float] | None = None,
    slots: Mapping[str, int] | None = None,
    quality: QualityInputs | None = None,
) -> dict[str, Any]:
    """The whole report (`weights`, `slots`: each tenant's, each backend's, from the config;
    `quality`: verdicts); raises ValueError on no rows, an unknown baseline or bad counts."""
    if not rows:
        raise ValueError("no ledger rows to report on")
    if resamples < 1 or buckets < 1:
        raise ValueError("resamples and buckets must be at least 1")
    by_arm = _group_by([r for r in rows if not r.batch] if any(r.arm for r in rows) else rows,
                       lambda r: r.arm)
    arms = list(by_arm)
    if baseline is None:
        baseline = arms[0]
    elif baseline not in by_arm:
        raise ValueError(f"baseline arm {baseline!r} is not in the ledger (arms: "
                         f"{', '.join(arms)})")
    first, last = min(r.ts for r in rows), max(r.ts for r in rows)
    report: dict[str, Any] = {
        "header": {
            "rows": len(rows),
            "currency": currency,
            "first_ts": first,
            "last_ts": last,
            "first": _iso(first),
            "last": _iso(last),
            "experiments": sorted({r.experiment for r in rows if r.experiment is not None}),
            "routes": sorted({r.route for r in rows if r.route is not None}),
            "arms": arms,
            "baseline": baseline,
            "quantile_method": QUANTILE_METHOD,
            "ci_level": CI_LEVEL,
            "resamples": resamples,
            "seed": seed,
        },
        "total": group_stats(rows),
        "arms": [_arm_entry(name, arm_rows) for name, arm_rows in by_arm.items()],
        "comparisons": [
            compare(by_arm[name], by_arm[baseline], arm=name, baseline=baseline,
                    resamples=resamples, seed=seed)
            for name in arms if name != baseline
        ],
        "timeseries": timeseries(by_arm, first, last, buckets),
    }
    if (replicas := replica_breakdown(rows)) is not None:
        report["replicas"] = replicas
    if (slo := slo_breakdown(rows)) is not None:  # TTFT objectives: router/report/slo.py
        report["slo"] = slo
    if (apis := api_breakdown(rows, group_stats)) is not None:  # router/report/apis.py
        report["apis"] = apis
    if (tenants := tenant_breakdown(rows, group_stats, weights or {})) is not None:
        report["tenants"] = tenants
    if (batch := batch_breakdown(rows, slots or {})) is not None:
        report["batch"] = batch
    if quality is not None and (judged := quality_breakdown(rows, quality)) is not None:
        report["quality"] = judged
    return report


def group_stats(rows: Sequence[LedgerRow]) -> dict[str, Any]:
    """The figures of one group of rows (see the module docstring for each definition)."""
    n = len(rows)
    served = [r for r in rows if is_served(r)]
    fallback = sum(1 for r in served if is_fallback(r))
    status_429 = sum(1 for r in rows if r.status == 429)
    timeouts = sum(1 for r in rows if r.error in TIMEOUT_ERRORS)
    errors = sum(1 for r in rows if r.status >= 500 and r.error not in TIMEOUT_ERRORS)
    disconnects = sum(1 for r in rows if r.status == 499)
    cost = fsum(r.cost for r in rows)  # correctly rounded: 0.1 + 0.2 is 0.3 here
    counterfactual = fsum(r.counterfactual_cost for r in rows)
    waits = queue_waits(rows)
    ttfts = [r.ttft_ms for r in rows if r.ttft_ms is not None]
    wait_p50, wait_p95 = _quantiles(waits, (0.5, 0.95))
    ttft_p50, ttft_p95 = _quantiles(ttfts, (0.5, 0.95))
    return {
        "requests": n,
        "served": len(served),
        "fallback": fallback,
        "fallback_share": _share(fallback, len(served)),
        "status_429": status_429,
        "rate_429": _share(status_429, n),
        "timeouts": timeouts,
        "timeout_rate": _share(timeouts, n),
        "errors": errors,
        "error_rate": _share(errors, n),
        "disconnects": disconnects,
        "disconnect_rate": _share(disconnects, n),
        "prompt_tokens": sum(r.prompt_tokens for r in rows),
        "completion_tokens": sum(r.completion_tokens for r in rows),
        "estimated_share": _share(sum(1 for r in rows if r.tokens_estimated), n),
        "cost": cost,
        "cost_per_request": cost / n if n else None,
        "cost_per_1k": 1000 * cost / n if n else None,
        "counterfactual_cost": counterfactual,
        "saving": counterfactual - cost,
        "saving_pct": 100 * (counterfactual - cost) / counterfactual if counterfactual else None,
        "queue_wait_n": len(waits),
        "queue_wait_p50_ms": wait_p50,
        "queue_wait_p95_ms": wait_p95,
        "ttft_n": len(ttfts),
        "ttft_p50_ms": ttft_p50,
        "ttft_p95_ms": ttft_p95,
    }


def replica_breakdown(rows: Sequence[LedgerRow]) -> list[dict[str, Any]] | None:
    """Each backend's figures with its replicas'; None unless some backend had several."""
    by_backend = _group_by((r for r in rows if r.backend is not None), lambda r: r.backend)
    if all(len({r.replica for r in rs if r.replica is not None}) < 2
           for rs in by_backend.values()):
        return None
    return [
        {"backend": backend, **group_stats(backend_rows),
         "replicas": [{"replica": name, "share": len(replica_rows) / len(backend_rows),
                       **group_stats(replica_rows)}
                      for name, replica_rows in _group_by(backend_rows,
                                                          lambda r: r.replica).items()]}
        for backend, backend_rows in by_backend.items()
    ]


def is_served(row: LedgerRow) -> bool:
    return row.backend is not None and row.status == 200


def is_fallback(row: LedgerRow) -> bool:
    return is_served(row) and row.backend != row.primary


def queue_waits(rows: Iterable[LedgerRow]) -> list[float]:
    """Queue waits of the rows that reached a backend's pool (queued or admitted at once)."""
    return [r.queue_wait_ms for r in rows if r.backend is not None and r.error != "queue_full"]


def compare(arm_rows: Sequence[LedgerRow], base_rows: Sequence[LedgerRow], *, arm: str,
            baseline: str, resamples: int, seed: int) -> dict[str, Any]:
    """Arm minus baseline: mean cost per request and p95 queue wait, with bootstrap CIs.

    `saving_pct` is (baseline mean cost - arm mean cost) in % of the baseline's mean cost:
    positive when the arm is cheaper. Its interval is None when a baseline resample has a
    mean cost of 0 (the ratio is undefined there); so is the value when the baseline's mean
    cost is 0.
    """
    rng = np.random.default_rng(seed)
    cost_a = np.array([r.cost for r in arm_rows], dtype=np.float64)
    cost_b = np.array([r.cost for r in base_rows], dtype=np.float64)
    boot_a = bootstrap(cost_a, _mean, resamples, rng)
    boot_b = bootstrap(cost_b, _mean, resamples, rng)
    mean_a, mean_b = float(cost_a.mean()), float(cost_b.mean())
    saving: dict[str, Any] = {"value": None, "ci": None}
    if mean_b > 0:
        saving["value"] = 100 * (mean_b - mean_a) / mean_b
        if bool(np.all(boot_b > 0)):
            saving["ci"] = _ci(100 * (boot_b - boot_a) / boot_b)
    return {
        "arm": arm,
        "baseline": baseline,
        "requests": len(arm_rows),
        "baseline_requests": len(base_rows),
        "cost_per_request": {"arm": mean_a, "baseline": mean_b, "diff": mean_a - mean_b,
                             "ci": _ci(boot_a - boot_b)},
        "saving_pct": saving,
        "queue_wait_p95_ms": _compare_p95(queue_waits(arm_rows), queue_waits(base_rows),
                                          resamples, rng),
    }


def bootstrap(values: Floats, statistic: Statistic, resamples: int,
              rng: np.random.Generator) -> Floats:
    """`statistic` of `resamples` resamples (with replacement) of `values`, vectorised."""
    n = len(values)
    out = np.empty(resamples, dtype=np.float64)
    chunk = max(1, _CHUNK_CELLS // max(n, 1))
    for start in range(0, resamples, chunk):
        k = min(chunk, resamples - start)
        out[start:start + k] = statistic(values[rng.integers(0, n, size=(k, n))])
    return out


def _compare_p95(arm: list[float], base: list[float], resamples: int,
                 rng: np.random.Generator) -> dict[str, Any]:
    a = np.array(arm, dtype=np.float64)
    b = np.array(base, dtype=np.float64)
    p95_a = _quantile(a, 0.95) if a.size else None
    p95_b = _quantile(b, 0.95) if b.size else None
    if p95_a is None or p95_b is None:  # nobody of one arm reached a queue
        return {"arm": p95_a, "baseline": p95_b, "diff": None, "ci": None}
    diffs = bootstrap(a, _p95, resamples, rng) - bootstrap(b, _p95, resamples, rng)
    return {"arm": p95_a, "baseline": p95_b, "diff": p95_a - p95_b, "ci": _ci(diffs)}


def timeseries(by_arm: dict[str, list[LedgerRow]], first: float, last: float,
               buckets: int) -> dict[str, Any]:
    """[first, last] cut into `buckets` equal spans; per arm, requests and fallback share.

    A row falls in bucket floor((ts - first) / width), the last bucket closed at `last`.
    The fallback share of a bucket is None when none of its rows was served.
    """
    width = (last - first) / buckets
    series = []
    for name, rows in by_arm.items():
        requests = [0] * buckets
        served = [0] * buckets
        fallback = [0] * buckets
        for r in rows:
            i = min(int((r.ts - first) / width), buckets - 1) if width > 0 else 0
            requests[i] += 1
            served[i] += is_served(r)
            fallback[i] += is_fallback(r)
        series.append({"arm": name, "requests": requests,
                       "fallback_share": [_share(f, s) for f, s in zip(fallback, served,
                                                                         strict=True)]})
    return {"first_ts": first, "last_ts": last, "bucket_s": width,
            "starts": [first + i * width for i in range(buckets)], "arms": series}


_SPAN = re.compile(r"(\d+(?:\.\d*)?)\s*([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_when(text: str, now: float) -> float:
    """Unix seconds for `--since/--until`.

    Either an ISO 8601 date or date-time (without a zone: UTC), e.g. 2024-05-01 or
    2024-05-01T12:30:00+02:00, or a span before `now`: 90s, 30m, 2h, 7d, 1w.
    """
    span = _SPAN.fullmatch(text.strip())
    if span is not None:
        return now - float(span[1]) * _UNIT_S[span[2]]
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is neither an ISO 8601 date or date-time nor a span "
                         "like 90s, 30m, 2h, 7d") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def _arm_entry(name: str, rows: list[LedgerRow]) -> dict[str, Any]:
    by_backend = _group_by(rows, lambda r: r.backend)
    waits = np.array(queue_waits(rows), dtype=np.float64)
    percentiles = (
        [float(v) for v in np.quantile(waits, np.linspace(0, 1, 101), method=QUANTILE_METHOD)]
        if waits.size else []
    )
    return {
        "arm": name,
        **group_stats(rows),
        "queue_wait_percentiles_ms": percentiles,  # the 0th, 1st, ..., 100th percentile
        "backends": [{"backend": b, **group_stats(rs)} for b, rs in by_backend.items()],
    }


def _group_by(rows: Iterable[LedgerRow],
              key: Callable[[LedgerRow], str | None]) -> dict[str, list[LedgerRow]]:
    """Rows by key, in sorted key order, a None key as "(none)" last."""
    groups: dict[str | None, list[LedgerRow]] = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    names = sorted(k for k in groups if k is not None)
    out = {name: groups[name] for name in names}
    if None in groups:
        out[NONE_GROUP] = groups[None]
    return out


def _mean(sample: Floats) -> Floats:
    means: Floats = sample.mean(axis=1)
    return means


def _p95(sample: Floats) -> Floats:
    """Each row's 95th percentile, "linear" as np.quantile; one partition, not np.quantile's
    two-pivot partition along an axis, which is several times slower."""
    n = sample.shape[1]
    h = (n - 1) * 0.95
    j = int(h)
    part = np.partition(sample, j, axis=1)
    low = part[:, j]
    high = part[:, j + 1:].min(axis=1) if j + 1 < n else low
    result: Floats = low + (h - j) * (high - low)
    return result


def _quantile(values: Floats, q: float) -> float:
    return float(np.quantile(values, q, method=QUANTILE_METHOD))


def _quantiles(values: Sequence[float], qs: tuple[float, ...]) -> list[float | None]:
    if not values:
        return [None] * len(qs)
    array = np.array(values, dtype=np.float64)
    return [_quantile(array, q) for q in qs]


def _ci(draws: Floats) -> list[float]:
    tail = (1 - CI_LEVEL) / 2
    low, high = np.quantile(draws, (tail, 1 - tail), method=QUANTILE_METHOD)
    return [float(low), float(high)]


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")
