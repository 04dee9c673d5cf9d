"""router.report.build: every figure of the cost report against numbers worked out by hand.

The ledger below is small on purpose: fourteen requests over two arms, two backends and one
row without an arm, each number chosen so the expected values can be checked on paper.
Quantiles are numpy's "linear": h = (n - 1) * q, x[floor h] + frac(h) * (x[ceil h] - x[floor h]).
"""

from __future__ import annotations

import csv
import io
from typing import Any

import numpy as np
import orjson
import pytest

from router.ledger.base import LedgerRow
from router.report.build import _p95, bootstrap, build_report, compare, parse_when
from router.report.render import render_csv, render_html, render_json, render_text
from tests.support import T0, hand_ledger, row

approx = pytest.approx


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return build_report(hand_ledger(), currency="EUR", buckets=4, resamples=500, seed=7)


def arm(report: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(a for a in report["arms"] if a["arm"] == name)
    return found


def backend(report: dict[str, Any], arm_name: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        b for b in arm(report, arm_name)["backends"] if b["backend"] == name)
    return found


def test_header(report: dict[str, Any]) -> None:
    h = report["header"]
    assert h["rows"] == 14
    assert h["currency"] == "EUR"
    assert (h["first_ts"], h["last_ts"]) == (T0, T0 + 100)
    assert (h["first"], h["last"]) == ("2023-11-14T22:13:20+00:00", "2023-11-14T22:15:00+00:00")
    assert h["experiments"] == ["exp1"]
    assert h["routes"] == ["chat", "other"]
    assert h["arms"] == ["off", "on", "(none)"]  # sorted, the arm-less group last
    assert h["baseline"] == "off"  # the first by name
    assert h["quantile_method"] == "linear"


def test_arm_off(report: dict[str, Any]) -> None:
    off = arm(report, "off")
    assert off["requests"] == 6
    assert (off["served"], off["fallback"], off["fallback_share"]) == (3, 0, 0.0)  # off1..3
    assert off["rate_429"] == approx(1 / 6)  # off4
    assert off["timeout_rate"] == approx(1 / 6)  # off5 (503 queue_timeout: not an error)
    assert off["error_rate"] == approx(1 / 6)  # off6 (502)
    assert off["disconnect_rate"] == 0.0
    assert off["prompt_tokens"] == 105  # 10 + 20 + 30 + 15 + 25 + 5
    assert off["completion_tokens"] == 120  # 20 + 40 + 60
    assert off["estimated_share"] == approx(2 / 6)  # off3, off5
    assert off["cost"] == approx(0.6)  # 0.1 + 0.2 + 0.3
    assert off["cost_per_request"] == approx(0.1)  # 0.6 / 6
    assert off["cost_per_1k"] == approx(100.0)
    assert off["counterfactual_cost"] == approx(0.6)
    assert off["saving"] == approx(0.0)
    assert off["saving_pct"] == approx(0.0)
    # waits of off1,2,3,5,6 (off4 was rejected at once): [0, 100, 200, 400, 1000]
    assert off["queue_wait_n"] == 5
    assert off["queue_wait_p50_ms"] == approx(200)  # h = 2
    assert off["queue_wait_p95_ms"] == approx(880)  # h = 3.8: 400 + 0.8 * 600
    assert off["ttft_n"] == 3
    assert off["ttft_p50_ms"] == approx(200)  # [100, 200, 300], h = 1
    assert off["ttft_p95_ms"] == approx(290)  # h = 1.9: 200 + 0.9 * 100
    assert [b["backend"] for b in off["backends"]] == ["big"]
    big = backend(report, "off", "big")
    assert {k: v for k, v in big.items() if k != "backend"} == {
        k: v for k, v in off.items()
        if k not in ("arm", "backends", "queue_wait_percentiles_ms")}


def test_arm_on(report: dict[str, Any]) -> None:
    on = arm(report, "on")
    assert on["requests"] == 7
    # served: on1, on2 (small), on3, on6 (big); on5 timed out, on7 never got a backend
    assert (on["served"], on["fallback"], on["fallback_share"]) == (4, 2, 0.5)
    assert on["rate_429"] == 0.0
    assert on["timeout_rate"] == approx(1 / 7)  # on5
    assert on["error_rate"] == 0.0  # on5's 504 is a timeout; on7's 400 is not a 5xx
    assert on["disconnect_rate"] == approx(1 / 7)  # on4
    assert on["prompt_tokens"] == 93  # 10 + 20 + 30 + 8 + 12 + 10 + 3
    assert on["completion_tokens"] == 130  # 20 + 40 + 60 + 10
    assert on["estimated_share"] == approx(2 / 7)  # on5, on6
    assert on["cost"] == approx(0.38)  # 0.01 + 0.02 + 0.30 + 0.05
    assert on["cost_per_request"] == approx(0.38 / 7)  # 0.0542857...
    assert on["cost_per_1k"] == approx(54.285714, rel=1e-6)
    assert on["counterfactual_cost"] == approx(0.65)  # 0.10 + 0.20 + 0.30 + 0.05
    assert on["saving"] == approx(0.27)  # 0.65 - 0.38
    assert on["saving_pct"] == approx(41.538462, rel=1e-6)  # 0.27 / 0.65
    # waits of on1..on6 (on7 has no backend): [0, 0, 0, 100, 300, 500]
    assert on["queue_wait_n"] == 6
    assert on["queue_wait_p50_ms"] == approx(50)  # h = 2.5: 0 + 0.5 * 100
    assert on["queue_wait_p95_ms"] == approx(450)  # h = 4.75: 300 + 0.75 * 200
    assert on["ttft_n"] == 5  # [50, 60, 80, 150, 250]
    assert on["ttft_p50_ms"] == approx(80)
    assert on["ttft_p95_ms"] == approx(230)  # h = 3.8: 150 + 0.8 * 100
    assert len(on["queue_wait_percentiles_ms"]) == 101
    assert on["queue_wait_percentiles_ms"][0] == 0.0
    assert on["queue_wait_percentiles_ms"][-1] == 500.0


def test_backends_within_an_arm(report: dict[str, Any]) -> None:
    assert [b["backend"] for b in arm(report, "on")["backends"]] == ["big", "small", "(none)"]
    big = backend(report, "on", "big")  # on3, on4, on6
    assert (big["requests"], big["served"], big["fallback_share"]) == (3, 2, 0.0)
    assert big["disconnect_rate"] == approx(1 / 3)
    assert big["cost"] == approx(0.35)  # 0.30 + 0.05
    assert big["queue_wait_p50_ms"] == approx(300)  # [100, 300, 500]
    assert big["queue_wait_p95_ms"] == approx(480)  # h = 1.9: 300 + 0.9 * 200
    assert big["ttft_p50_ms"] == approx(200)  # [150, 250]
    assert big["ttft_p95_ms"] == approx(245)  # h = 0.95: 150 + 0.95 * 100
    small = backend(report, "on", "small")  # on1, on2, on5
    assert (small["requests"], small["served"], small["fallback"]) == (3, 2, 2)
    assert small["fallback_share"] == 1.0
    assert small["timeout_rate"] == approx(1 / 3)
    assert small["cost"] == approx(0.03)
    assert small["counterfactual_cost"] == approx(0.30)
    assert small["saving_pct"] == approx(90.0)  # 0.27 / 0.30
    assert (small["queue_wait_p50_ms"], small["queue_wait_p95_ms"]) == (0.0, 0.0)
    assert small["ttft_p95_ms"] == approx(78)  # [50, 60, 80], h = 1.9: 60 + 0.9 * 20
    nobody = backend(report, "on", "(none)")  # on7, a bad request
    assert nobody["requests"] == 1
    assert nobody["fallback_share"] is None  # nothing served
    assert nobody["saving_pct"] is None  # a counterfactual of 0
    assert nobody["queue_wait_n"] == 0
    assert nobody["queue_wait_p50_ms"] is None and nobody["ttft_p95_ms"] is None


def test_total(report: dict[str, Any]) -> None:
    total = report["total"]
    assert total["requests"] == 14
    assert (total["served"], total["fallback"], total["fallback_share"]) == (8, 2, 0.25)
    assert total["rate_429"] == approx(1 / 14)
    assert total["timeout_rate"] == approx(2 / 14)
    assert total["error_rate"] == approx(1 / 14)
    assert total["disconnect_rate"] == approx(1 / 14)
    assert total["prompt_tokens"] == 203  # 105 + 93 + 5
    assert total["completion_tokens"] == 255  # 120 + 130 + 5
    assert total["estimated_share"] == approx(4 / 14)
    assert total["cost"] == approx(1.0)  # 0.6 + 0.38 + 0.02
    assert total["counterfactual_cost"] == approx(1.27)  # 0.6 + 0.65 + 0.02
    assert total["saving"] == approx(0.27)
    assert total["saving_pct"] == approx(21.259843, rel=1e-6)  # 0.27 / 1.27
    assert total["cost_per_request"] == approx(1 / 14)
    # [0, 0, 0, 0, 50, 100, 100, 200, 300, 400, 500, 1000]
    assert total["queue_wait_p50_ms"] == approx(100)  # h = 5.5
    assert total["queue_wait_p95_ms"] == approx(725)  # h = 10.45: 500 + 0.45 * 500
    # [50, 60, 80, 100, 120, 150, 200, 250, 300]
    assert total["ttft_p50_ms"] == approx(120)  # h = 4
    assert total["ttft_p95_ms"] == approx(280)  # h = 7.6: 250 + 0.6 * 50


def test_comparisons_point_estimates(report: dict[str, Any]) -> None:
    on, nobody = report["comparisons"]
    assert (on["arm"], on["baseline"], on["requests"], on["baseline_requests"]) == (
        "on", "off", 7, 6)
    cost = on["cost_per_request"]
    assert (cost["arm"], cost["baseline"]) == (approx(0.38 / 7), approx(0.1))
    assert cost["diff"] == approx(-0.0457142857)  # 0.0542857 - 0.1
    assert on["saving_pct"]["value"] == approx(45.7142857)  # (0.1 - 0.0542857) / 0.1
    wait = on["queue_wait_p95_ms"]
    assert [wait["arm"], wait["baseline"], wait["diff"]] == approx([450, 880, -430])
    for figure in (cost, wait):
        low, high = figure["ci"]
        assert low <= high
    # half of off's rows cost nothing: one resample in 2 ** 6 = 64 has a mean cost of 0,
    # where a saving in % is undefined, so no interval is given for it
    assert on["saving_pct"]["ci"] is None
    assert nobody["arm"] == "(none)"
    assert nobody["cost_per_request"]["diff"] == approx(-0.08)  # 0.02 - 0.1
    assert nobody["queue_wait_p95_ms"]["diff"] == approx(-830)  # 50 - 880


def test_another_baseline_and_bad_input() -> None:
    report = build_report(hand_ledger(), baseline="on", resamples=10)
    assert [c["arm"] for c in report["comparisons"]] == ["off", "(none)"]
    assert report["comparisons"][0]["cost_per_request"]["diff"] == approx(0.1 - 0.38 / 7)
    with pytest.raises(ValueError, match="baseline arm 'nope'"):
        build_report(hand_ledger(), baseline="nope")
    with pytest.raises(ValueError, match="no ledger rows"):
        build_report([])


def test_timeseries(report: dict[str, Any]) -> None:
    ts = report["timeseries"]
    assert ts["bucket_s"] == 25.0  # 100 s in 4 buckets
    assert ts["starts"] == [T0, T0 + 25, T0 + 50, T0 + 75]
    series = {a["arm"]: a for a in ts["arms"]}
    assert series["off"]["requests"] == [3, 2, 1, 0]  # ts 0 10 20 | 30 40 | 50
    assert series["off"]["fallback_share"] == [0.0, None, None, None]  # only off1..3 served
    assert series["on"]["requests"] == [2, 3, 2, 0]  # 5 15 | 25 35 45 | 55 60
    assert series["on"]["fallback_share"] == [1.0, 0.0, 0.0, None]
    assert series["(none)"]["requests"] == [0, 0, 0, 1]  # ts 100: the last bucket is closed
    assert series["(none)"]["fallback_share"] == [None, None, None, 0.0]


def test_one_instant_goes_to_the_first_bucket() -> None:
    report = build_report([row("a", 0, "x", "big"), row("b", 0, "x", "small")], buckets=3)
    assert report["timeseries"]["arms"][0]["requests"] == [2, 0, 0]
    assert report["timeseries"]["arms"][0]["fallback_share"] == [0.5, None, None]


def test_report_is_plain_json(report: dict[str, Any]) -> None:
    assert orjson.loads(render_json(report)) == report


# ---- the bootstrap ---------------------------------------------------------------------


def arm_rows(name: str, costs: list[float], waits: list[float]) -> list[LedgerRow]:
    return [row(f"{name}{i}", i, name, "big", wait=w, cost=c)
            for i, (c, w) in enumerate(zip(costs, waits, strict=True))]


def test_ci_excludes_zero_between_different_arms() -> None:
    cheap = arm_rows("a", [0.5, 0.7] * 100, [10.0 * (i % 20) for i in range(200)])  # mean 0.6
    dear = arm_rows("b", [1.0, 1.2] * 100, [50.0 * (i % 20) for i in range(200)])  # mean 1.1
    result = compare(cheap, dear, arm="a", baseline="b", resamples=2000, seed=0)
    cost = result["cost_per_request"]
    assert cost["diff"] == approx(-0.5)
    assert cost["ci"][1] < 0  # the whole interval below zero
    assert cost["ci"][0] < -0.5 < cost["ci"][1]
    # 200 waits, ten each of 0, 10, ..., 190: h = 199 * 0.95 = 189.05, between the last 180
    # (index 189) and the first 190: 180.5; likewise 900 + 0.05 * 50 = 902.5 for the other
    assert result["queue_wait_p95_ms"]["diff"] == approx(180.5 - 902.5)
    assert result["queue_wait_p95_ms"]["ci"][1] < 0
    assert result["saving_pct"]["value"] == approx(45.4545454)  # 0.5 / 1.1
    assert result["saving_pct"]["ci"][0] > 0


def test_ci_includes_zero_between_identical_arms() -> None:
    costs = [0.1 * (i % 7) for i in range(300)]
    waits = [float((i * 37) % 500) for i in range(300)]
    result = compare(arm_rows("a", costs, waits), arm_rows("b", costs, waits), arm="a",
                     baseline="b", resamples=2000, seed=0)
    for key in ("cost_per_request", "queue_wait_p95_ms"):
        low, high = result[key]["ci"]
        assert result[key]["diff"] == 0.0
        assert low < 0 < high


def test_bootstrap_is_seeded() -> None:
    rows = arm_rows("a", [0.1, 0.9, 0.4] * 20, [1.0, 5.0, 9.0] * 20)
    other = arm_rows("b", [0.3, 0.5] * 30, [2.0, 4.0] * 30)
    first = compare(rows, other, arm="a", baseline="b", resamples=300, seed=1)
    assert compare(rows, other, arm="a", baseline="b", resamples=300, seed=1) == first
    assert compare(rows, other, arm="a", baseline="b", resamples=300, seed=2) != first


def test_fast_p95_is_numpy_linear() -> None:
    rng = np.random.default_rng(5)
    for n in (1, 2, 3, 20, 21, 101):
        sample = rng.exponential(10.0, size=(40, n))
        assert _p95(sample) == approx(np.quantile(sample, 0.95, axis=1, method="linear"))


def test_bootstrap_resamples_with_replacement() -> None:
    values = np.array([1.0, 2.0, 3.0])
    means = bootstrap(values, lambda s: s.mean(axis=1), 5000, np.random.default_rng(0))
    assert means.shape == (5000,)
    assert means.min() >= 1.0 and means.max() <= 3.0
    assert (means == 1.0).any() and (means == 3.0).any()  # all-ones and all-threes happen
    assert bootstrap(np.array([4.0]), _p95, 10, np.random.default_rng(0)).tolist() == [4.0] * 10


def test_ten_thousand_rows_of_one_distribution_show_no_saving() -> None:
    # Its speed is measured in bench/report_compare.py, never here.
    rng = np.random.default_rng(0)
    costs, waits = rng.random(10_000).tolist(), rng.exponential(300, 10_000).tolist()
    rows = arm_rows("a", costs[:5000], waits[:5000]) + arm_rows("b", costs[5000:], waits[5000:])
    result = compare(rows[:5000], rows[5000:], arm="a", baseline="b", resamples=2000, seed=0)
    low, high = result["saving_pct"]["ci"]
    assert low < 0 < high  # costs drawn alike: no saving either way
    assert result["requests"] == result["baseline_requests"] == 5000


# ---- parse_when --------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("90s", 10_000 - 90),
    ("30m", 10_000 - 1_800),  # 30 * 60
    ("2h", 10_000 - 7_200),
    ("1.5h", 10_000 - 5_400),
    ("7d", 10_000 - 604_800),  # 7 * 86400
    ("1w", 10_000 - 604_800),
    (" 2h ", 10_000 - 7_200),
    ("2024-05-01", 1_714_521_600),  # 2024-01-01 is 1704067200, plus 121 days of 86400 s
    ("2024-05-01T12:30:00", 1_714_566_600),  # naive is UTC: + 12.5 h
    ("2024-05-01T12:30:00Z", 1_714_566_600),
    ("2024-05-01T12:30:00+02:00", 1_714_559_400),  # two hours earlier in UTC
    ("2024-05-01 12:30", 1_714_566_600),
])
def test_parse_when(text: str, expected: float) -> None:
    assert parse_when(text, now=10_000) == expected


@pytest.mark.parametrize("text", ["", "yesterday", "5x", "-2h", "2h ago", "2024-13-01"])
def test_parse_when_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_when(text, now=10_000)


# ---- rendering ---------------------------------------------------------------------------


def test_csv_has_one_line_per_group(report: dict[str, Any]) -> None:
    lines = list(csv.DictReader(io.StringIO(render_csv(report))))
    assert [(r["scope"], r["arm"], r["backend"]) for r in lines] == [
        ("total", "", ""), ("arm", "off", ""), ("backend", "off", "big"), ("arm", "on", ""),
        ("backend", "on", "big"), ("backend", "on", "small"), ("backend", "on", "(none)"),
        ("arm", "(none)", ""), ("backend", "(none)", "big")]
    on = lines[3]
    assert on["requests"] == "7"
    assert float(on["cost"]) == approx(0.38)
    assert float(on["saving_pct"]) == approx(41.538462, rel=1e-6)
    assert float(on["queue_wait_p95_ms"]) == 450.0
    assert lines[6]["fallback_share"] == ""  # None: nothing served
    assert float(lines[5]["fallback_share"]) == 1.0


def test_text_shows_the_figures_within_100_columns(report: dict[str, Any]) -> None:
    text = render_text(report)
    assert max(len(line) for line in text.splitlines()) <= 100
    for figure in ("14 requests", "currency EUR", "baseline off",
                   "0.6000", "0.3800", "1.0000",  # total cost of off, on and all arms
                   "0.054286",  # on's cost per request, 0.38 / 7
                   "41.5%", "21.3%",  # savings of on and of all arms
                   "880.0", "450.0", "725.0",  # queue wait p95 of off, on, all
                   "45.7%",  # on's saving against off
                   "diff -0.045714", "diff -430.0"):
        assert figure in text, figure
    first_on = next(line for line in text.splitlines() if line.startswith("on "))
    assert first_on.split()[1:4] == ["7", "4", "50.0%"]  # the traffic table's row


def test_html_is_self_contained_and_escaped() -> None:
    rows = hand_ledger()
    rows[0] = rows[0]._replace(arm="<script>alert(1)</script>")
    rows[1] = rows[1]._replace(backend="a&b")
    page = render_html(build_report(rows, resamples=10))
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "a&amp;b" in page and "a&b" not in page
    assert "http://" not in page and "https://" not in page and "url(" not in page
    assert page.count("<svg class='chart'") == 3
