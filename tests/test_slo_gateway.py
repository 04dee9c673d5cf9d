"""TTFT objectives on a real gateway over a simulated engine: a request that meets its
class's objective and ones that miss it (late, or refused) move the right counters and
land in the ledger (SQLite and the real PostgreSQL) with the objective, the forecast and
the actual TTFT; `slotgate report` shows attainment per arm and class in every format."""

from __future__ import annotations

import asyncio
import csv
import io
from typing import Any

import openai
import orjson
import pytest

from router.ledger.base import LedgerRow
from router.report.build import build_report
from router.report.render import render_csv, render_html, render_json, render_text
from tests.support import (
    MESSAGES,
    SdkClients,
    StartGateway,
    assert_idle,
    drain_stream,
    engine,
    gateway_config,
    poll_until,
    row,
    rows_of,
    sim_backend,
    wait_pools,
)
from tests.support.scrape import scrape, value

SHED = {"x-slotgate-priority": "sheddable"}
ENGINE_TTFT_MS = 50.0  # the simulated engine's: every first token comes later than this


def config(target: str) -> dict[str, Any]:
    raw = gateway_config(sim_backend("m", slots=1, queue_limit=1, initial_hold_s=2.0,
                                     sim={"ttft_s": ENGINE_TTFT_MS / 1000}))
    # Standard requests cannot miss (an hour), sheddable ones cannot meet theirs (10 ms).
    raw["routes"]["chat"]["slo"] = {"standard": {"ttft_s": 3600}, "sheddable": {"ttft_s": 0.01}}
    raw["ledger"] = {"url" if target.startswith("postgres") else "path": target}
    raw["logging"] = {"access": False}
    return raw


async def test_met_late_and_refused_requests(
    sdk: SdkClients, start: StartGateway, ledger_target: str
) -> None:
    gw = await start(config(ledger_target))
    client = sdk(gw)

    def ask(rid: str, **kwargs: Any) -> Any:
        headers = {"X-Request-Id": rid, **kwargs.pop("extra_headers", {})}
        return client.chat.completions.create(model="chat", messages=MESSAGES,
                                              extra_headers=headers, **kwargs)

    await ask("met")
    async for _ in await ask("late", stream=True, extra_headers=SHED):
        pass
    before = await scrape(gw)
    assert value(before, "slotgate_slo_attained_total", backend="big", **{"class": "standard"}) \
        == 1
    assert value(before, "slotgate_slo_missed_total", backend="big", **{"class": "sheddable"}) \
        == 1
    # One holds the slot, one waits for it, and a sheddable newcomer finds the line full.
    sim = engine(gw)
    sim.hold()
    holder = asyncio.create_task(ask("holder"))
    await wait_pools(gw, lambda s: s["big"] == (1, 0))
    queued = asyncio.create_task(ask("queued"))
    await wait_pools(gw, lambda s: s["big"] == (1, 1))
    with pytest.raises(openai.RateLimitError):
        await ask("refused", extra_headers=SHED)
    sim.release()
    await asyncio.gather(holder, queued)
    await assert_idle(gw)

    samples = await scrape(gw)
    counts = {(kind, cls): value(samples, f"slotgate_slo_{kind}_total", backend="big",
                                 **{"class": cls})
              for kind in ("attained", "missed") for cls in ("critical", "standard", "sheddable")}
    assert counts == {("attained", "critical"): 0, ("attained", "standard"): 3,
                      ("attained", "sheddable"): 0, ("missed", "critical"): 0,
                      ("missed", "standard"): 0, ("missed", "sheddable"): 2}
    assert ("slotgate_slo_attained_total", (("backend", "big"), ("class", "critical"))) \
        in samples  # exported at 0 from startup
    forecasts = {cls: value(samples, "slotgate_ttft_forecast_log_ratio_bucket", backend="big",
                            le="+Inf", **{"class": cls}) for cls in ("standard", "sheddable")}
    assert forecasts == {"standard": 3, "sheddable": 1}  # the refused one had no first token

    rows = {r.request_id: r for r in await rows_of(gw, ledger_target)}
    assert set(rows) == {"met", "late", "holder", "queued", "refused"}
    for rid in ("met", "holder", "queued"):
        r = rows[rid]
        assert (r.priority, r.slo_ttft_ms, r.status) == ("standard", 3_600_000.0, 200)
        assert r.ttft_ms is not None and r.ttft_ms >= ENGINE_TTFT_MS
        assert r.predicted_ttft_ms is not None and r.predicted_ttft_ms >= ENGINE_TTFT_MS
    late, refused = rows["late"], rows["refused"]
    assert (late.priority, late.slo_ttft_ms, late.stream) == ("sheddable", 10.0, True)
    assert late.ttft_ms is not None and late.ttft_ms > 10.0
    assert late.predicted_ttft_ms is not None and late.predicted_ttft_ms >= ENGINE_TTFT_MS
    assert (refused.status, refused.error, refused.priority) == (429, "queue_full", "sheddable")
    assert (refused.slo_ttft_ms, refused.ttft_ms, refused.predicted_ttft_ms) == (10.0, None, None)
    # The waiter's forecast adds its predicted wait to what the holder's had.
    waiter, holder_ms = rows["queued"].predicted_ttft_ms, rows["holder"].predicted_ttft_ms
    assert waiter is not None and holder_ms is not None and waiter > holder_ms

    slo = build_report(list(rows.values()), resamples=10)["slo"]
    assert [(c["class"], c["judged"], c["attained"], c["missed"], c["attainment"])
            for c in slo["total"]] == [("all", 5, 3, 2, 0.6), ("standard", 3, 3, 0, 1.0),
                                       ("sheddable", 2, 0, 2, 0.0)]
    assert [a["arm"] for a in slo["arms"]] == ["(none)"]


async def test_the_forecast_reads_the_backends_answer_model(
    sdk: SdkClients, start: StartGateway
) -> None:
    """A request's predicted TTFT comes from its backend's answer model (the queue
    forecast's): cold, from the `rates` hint (ten minutes to a first token, far slower
    than the engine), then from what finished streams taught it, each answer once; a
    whole answer is predicted to its last token and teaches only its length."""
    gw = await start(gateway_config(sim_backend("m", slots=1, rates={"ttft_s": 600})))
    client = sdk(gw)
    answers = gw.gateway.backends["big"].clock.answers
    await drain_stream(client, "cold")
    await assert_idle(gw)  # its slot is released once what it taught is learnt
    assert answers.rate_samples == 1 and answers.ttft_s is not None and answers.ttft_s < 600
    await drain_stream(client, "warm")
    await assert_idle(gw)
    assert answers.rate_samples == 2
    await client.chat.completions.create(model="chat", messages=MESSAGES,
                                         extra_headers={"X-Request-Id": "whole"})
    await assert_idle(gw)
    assert (answers.rate_samples, len(answers.lengths)) == (2, 3)
    await poll_until(lambda: len(gw.gateway.recent) == 3)
    predicted = {r.request_id: r.predicted_ttft_ms or 0.0 for r in gw.gateway.recent}
    assert predicted["cold"] >= 600_000
    assert predicted["warm"] < 600_000
    assert answers.ttft_s is not None and answers.tokens_per_s is not None
    whole_s = answers.ttft_s + (8 - 1) / answers.tokens_per_s  # its 8 tokens, all measured
    assert whole_s * 1000 <= predicted["whole"] < 600_000


def _row(key: str, arm: str | None, priority: str | None, objective: float | None,
         ttft: float | None, status: int = 200, total: float = 0.0) -> LedgerRow:
    base = row(key, 0, arm, "big" if status != 429 else None, status, ttft=ttft)
    return base._replace(priority=priority, slo_ttft_ms=objective,
                         predicted_ttft_ms=None if ttft is None else 100.0,
                         total_ms=total if ttft is None else ttft)


def hand_rows() -> list[LedgerRow]:
    return [
        _row("off-c1", "off", "critical", 2000, 1500),  # met
        _row("off-c2", "off", "critical", 2000, 2500),  # late
        _row("off-s1", "off", "standard", 5000, 4000),  # met
        _row("off-s2", "off", "standard", 5000, None, 429),  # refused: missed
        _row("on-c1", "on", "critical", 500, 400),  # a route's own objective: met
        _row("on-c2", "on", "critical", 2000, 1000),  # met
        _row("on-x1", "on", "sheddable", 20000, None, 499, total=300),  # left early: not judged
        _row("on-x2", "on", "sheddable", 20000, None, 499, total=25000),  # left late: missed
        _row("old", "on", None, None, 100),  # before the ledger kept objectives: left out
    ]


def test_report_shows_attainment_per_arm_and_class() -> None:
    report = build_report(hand_rows(), resamples=10)
    figures = {(a["arm"], c["class"]): (c["requests"], c["judged"], c["attained"],
                                        c["attainment"], c["objectives_ms"])
               for a in report["slo"]["arms"] for c in a["classes"]}
    assert figures == {
        ("off", "all"): (4, 4, 2, 0.5, [2000.0, 5000.0]),
        ("off", "critical"): (2, 2, 1, 0.5, [2000.0]),
        ("off", "standard"): (2, 2, 1, 0.5, [5000.0]),
        ("on", "all"): (4, 3, 2, pytest.approx(2 / 3), [500.0, 2000.0, 20000.0]),
        ("on", "critical"): (2, 2, 2, 1.0, [500.0, 2000.0]),
        ("on", "sheddable"): (2, 1, 0, 0.0, [20000.0]),
    }
    total = {c["class"]: (c["judged"], c["attained"]) for c in report["slo"]["total"]}
    assert total == {"all": (7, 4), "critical": (4, 3), "standard": (2, 1), "sheddable": (1, 0)}

    text = render_text(report)
    assert max(len(line) for line in text.splitlines()) <= 100
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("TTFT objectives")))
    section = lines[start:start + 14]
    assert section[2] == "all arms"
    assert section[3].split() == ["all", "500-20,000", "8", "7", "4", "3", "57.1%"]
    assert ["critical", "500-2,000", "2", "2", "2", "0", "100.0%"] in [
        s.split() for s in section[section.index("on"):]]

    assert orjson.loads(render_json(report))["slo"] == report["slo"]

    lines_csv = [r for r in csv.DictReader(io.StringIO(render_csv(report)))
                 if r["scope"] == "slo"]
    assert [(r["arm"], r["class"], r["judged"], r["attained"]) for r in lines_csv][:4] == [
        ("", "all", "7", "4"), ("", "critical", "4", "3"), ("", "standard", "2", "1"),
        ("", "sheddable", "1", "0")]
    off_critical = next(r for r in lines_csv if (r["arm"], r["class"]) == ("off", "critical"))
    assert (off_critical["objective_ms"], float(off_critical["attainment"])) == ("2,000", 0.5)
    assert all(r["requests"] == "" for r in lines_csv)  # the group columns stay empty

    page = render_html(report)
    table = page[page.index("<h2>TTFT objectives"):]
    assert "<tr class='arm'><td>off</td>" in table
    assert "<tr class='backend'><td>critical</td><td>2,000</td><td>2</td><td>2</td>" \
           "<td>1</td><td>1</td><td>50.0%</td></tr>" in table


def test_a_ledger_without_objectives_has_no_attainment_section() -> None:
    old = [r for r in hand_rows() if r.slo_ttft_ms is None]
    report = build_report(old, resamples=10)
    assert "slo" not in report
    assert "TTFT objectives" not in render_text(report) + render_html(report)
    assert "class" not in render_csv(report).splitlines()[0].split(",")
