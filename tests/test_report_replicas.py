"""The report's replica breakdown: each backend's engines, in every format, only when some
backend's rows name several; with one engine per backend the report is as it always was.

The hand ledger of tests/support.py with replicas set: "big" ran on big-0 and big-1 (three
of its rows reached no engine), "small" is a single engine named like its backend.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import orjson
import pytest

from router.ledger.base import LedgerRow
from router.report.build import build_report
from router.report.render import render_csv, render_html, render_json, render_text
from tests.support import hand_ledger

approx = pytest.approx
REPLICAS = {"off1": "big-0", "off2": "big-0", "on3": "big-0", "none1": "big-0",
            "off3": "big-1", "off6": "big-1", "on6": "big-1",
            "on1": "small", "on2": "small", "on5": "small"}  # the others reached no engine
RENDERERS = (render_text, render_csv, render_json, render_html)


def with_replicas(names: dict[str, str]) -> list[LedgerRow]:
    return [r._replace(replica=names.get(r.id)) for r in hand_ledger()]


def report_of(rows: list[LedgerRow]) -> dict[str, Any]:
    return build_report(rows, currency="EUR", buckets=4, resamples=50, seed=7)


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return report_of(with_replicas(REPLICAS))


def test_each_backend_with_its_replicas(report: dict[str, Any]) -> None:
    big, small = report["replicas"]  # backends by name; rows without a backend left out
    assert (big["backend"], big["requests"], small["backend"], small["requests"]) == (
        "big", 10, "small", 3)
    assert [(r["replica"], r["requests"], r["share"]) for r in big["replicas"]] == [
        ("big-0", 4, approx(0.4)), ("big-1", 3, approx(0.3)), ("(none)", 3, approx(0.3))]
    big0, big1, queued = big["replicas"]
    assert big0["cost"] == approx(0.62) and big1["cost"] == approx(0.35)
    assert (big0["prompt_tokens"], big0["completion_tokens"]) == (65, 125)
    assert (big0["ttft_p50_ms"], big0["ttft_p95_ms"]) == (approx(160.0), approx(242.5))
    assert (big1["ttft_p50_ms"], big1["ttft_p95_ms"]) == (approx(225.0), approx(292.5))
    assert queued["ttft_n"] == 0 and queued["cost"] == 0
    assert [(r["replica"], r["share"]) for r in small["replicas"]] == [("small", 1.0)]
    assert orjson.loads(render_json(report))["replicas"] == orjson.loads(
        orjson.dumps(report["replicas"]))


def test_one_engine_per_backend_leaves_the_report_as_it_was() -> None:
    """Rows naming their backend as replica (one engine each) report as rows naming none."""
    single = with_replicas({key: "big" if name.startswith("big") else name
                            for key, name in REPLICAS.items()})
    plain, named = report_of(hand_ledger()), report_of(single)
    assert "replicas" not in named
    for render in RENDERERS:
        assert render(named) == render(plain), render.__name__


def test_one_backend_of_several_replicas_is_enough() -> None:
    rows = with_replicas({"off1": "big-0", "off2": "big-1"})
    assert [b["backend"] for b in report_of(rows)["replicas"]] == ["big", "small"]


def test_text_has_the_breakdown_within_100_columns(report: dict[str, Any]) -> None:
    text = render_text(report)
    assert max(len(line) for line in text.splitlines()) <= 100
    lines = text.splitlines()
    start = lines.index("Replicas per backend (all arms; share of the backend's requests; "
                        "tokens)")
    table = lines[start + 1:start + 8]
    assert table[0].split() == ["requests", "share", "prompt", "compl.", "cost", "TTFT", "p50",
                                "TTFT", "p95"]
    assert [line.split()[:3] for line in table[1:]] == [
        ["big", "10", "-"], ["big-0", "4", "40.0%"], ["big-1", "3", "30.0%"],
        ["(none)", "3", "30.0%"], ["small", "3", "-"], ["small", "3", "100.0%"]]
    assert table[2].startswith("  big-0") and table[2].split()[3:] == [
        "65", "125", "0.6200", "160.0", "242.5"]
    assert lines.index("Each arm minus the baseline off (95% bootstrap CI, 50 resamples, "
                       "seed 7)") > start  # after the breakdown, before the comparisons


def test_csv_has_a_line_per_replica(report: dict[str, Any]) -> None:
    lines = list(csv.DictReader(io.StringIO(render_csv(report))))
    plain = list(csv.DictReader(io.StringIO(render_csv(report_of(hand_ledger())))))
    assert [{k: v for k, v in line.items() if k not in ("replica", "share")}
            for line in lines[:len(plain)]] == plain  # the groups as before, two more columns
    assert all(line["replica"] == line["share"] == "" for line in lines[:len(plain)])
    replicas = lines[len(plain):]
    assert [(r["scope"], r["arm"], r["backend"], r["replica"], r["requests"])
            for r in replicas] == [
        ("replica", "", "big", "big-0", "4"), ("replica", "", "big", "big-1", "3"),
        ("replica", "", "big", "(none)", "3"), ("replica", "", "small", "small", "3")]
    assert float(replicas[0]["share"]) == approx(0.4)
    assert float(replicas[0]["cost"]) == approx(0.62)
    assert replicas[2]["ttft_p50_ms"] == ""  # None: nothing reached an engine


def test_html_has_the_breakdown_escaped() -> None:
    names = {**REPLICAS, "off1": "<b>big-0</b>"}
    page = render_html(report_of(with_replicas(names)))
    section = page[page.index("<h2>Replicas per backend"):]
    assert "<tr class='replica'><td>&lt;b&gt;big-0&lt;/b&gt;</td><td>1</td><td>10.0%</td>" \
        in section
    assert "<tr class='group'><td>small</td><td>3</td><td>-</td>" in section
    assert "<b>big-0</b>" not in page and "tr.replica td:first-child" in page
