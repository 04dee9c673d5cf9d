"""The report's quality of downgrades (router/report/quality.py and quality_tables.py):
verdicts written through `router.quality.verdicts.record` into SQLite and PostgreSQL beside
ledger rows, read back into the report's figures, and shown as text, CSV, JSON and HTML by
`slotgate report` and GET /admin/report."""

from __future__ import annotations

import asyncio
import csv
import io
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from policies.config import PriceConfig
from policies.quality.judging import JUDGE_VERSION, Verdict
from policies.quality.stats import VerdictRow
from router.config import config_from_dict
from router.ledger.base import LedgerRow, RowFilter, Store
from router.ledger.open import open_store
from router.quality.verdicts import VerdictRecord, fetch, record
from router.report.build import build_report
from router.report.quality import Downgrade, QualityInputs, load, move_saving
from router.report.quality_tables import GROUPS_TITLE, thresholds_title
from router.report.render import render_csv, render_html, render_text
from tests.support import (
    MESSAGES,
    T0,
    SdkClients,
    StartGateway,
    assert_idle,
    gateway_config,
    sim_backend,
)
from tests.support import row as plain_row

approx = pytest.approx
# "big" costs 0.001 a slot-second (3.6 x 2 GPUs / 3600 / 2 slots), "small" 1 and 2 per
# million prompt and completion tokens.
RAW: dict[str, Any] = {
    "backends": {
        "big": {"simulated": {}, "model": "m-big", "slots": 2,
                "price": {"gpu_hour": 3.6, "gpus": 2}},
        "small": {"simulated": {}, "model": "m-small", "slots": 4,
                  "price": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}},
    },
    "routes": {"chat": {"primary": "big", "fallbacks": ["small"],
                        "fallback": {"when": "saturated", "min_confidence": 0.85}}},
}


def req(key: str, p: float | None, backend: str | None, *, intent: str = "greeting",
        cost: float = 0.0, counterfactual: float = 0.0, tokens: tuple[int, int] = (0, 0),
        slot_s: float = 0.0, status: int = 200, batch: bool = False) -> LedgerRow:
    return plain_row(key, 1.0, None, backend, status, tokens=tokens, cost=cost,
                     counterfactual=counterfactual, experiment=None)._replace(
        intent=intent, p_simple=p, slot_ms=slot_s * 1000, batch=batch)


def requests() -> list[LedgerRow]:
    """Four classified requests of the route that count, and four that do not."""
    return [
        req("m1", 0.95, "small", cost=0.002, counterfactual=0.010),  # moved: saved 0.008
        req("m2", 0.85, "small", cost=0.001, counterfactual=0.006),  # saved 0.005
        # on the primary: its cost less the small one's for the same tokens
        req("s1", 0.7, "big", cost=0.005, counterfactual=0.005, tokens=(1000, 500),
            slot_s=5),  # 0.005 - 0.002 = 0.003
        req("s2", 0.55, "big", cost=0.008, counterfactual=0.008, tokens=(2000, 1000),
            slot_s=8),  # 0.008 - 0.004 = 0.004
        req("code", 0.9, "big", intent="code", cost=1.0),  # an intent the route keeps
        req("refused", 0.9, None, status=429),
        req("plain", None, "big", cost=1.0),  # never classified: the primary was free
        req("line", 0.99, "big", cost=1.0, batch=True),  # a batch line stays on the primary
    ]


def judged(p: float, verdict: Verdict | None, saved: float, *, intent: str = "greeting",
           lang: str = "en", dt: float = 2.0) -> VerdictRecord:
    return VerdictRecord(request_id=f"r-{p}-{dt}", tenant="acme", route="chat",
                         intent=intent, language=lang, p_simple=p, prompt_tokens=12,
                         small_backend="small", primary_backend="big", verdict=verdict,
                         saved=saved, ts=T0 + dt)


VERDICTS = [
    judged(0.95, Verdict.BETTER, 0.008), judged(0.85, Verdict.TIE, 0.005),
    judged(0.9, Verdict.WORSE, 0.004), judged(0.88, Verdict.TIE, 0.001, intent="translate",
                                              lang="zh"),
    judged(0.82, None, 0.002),  # the judge's reply could not be read
    judged(0.99, Verdict.WORSE, 9.0, dt=-3600),  # an hour before the window
]


async def fill(store: Store) -> None:
    await store.write(requests())
    for verdict in VERDICTS:
        await record(store, verdict)
    await store.run("INSERT INTO verdicts (id, ts, request_id, route, language, "
                    "prompt_tokens, small_backend, primary_backend, verdict, judge_version, "
                    "saved) VALUES ('old', ?, 'r-old', 'chat', 'en', 5, 'small', 'big', "
                    "'worse', 'pairwise-0', 1.0)", (T0 + 3,))


async def report_of(target: str) -> dict[str, Any]:
    store = open_store(target)
    await store.open()
    try:
        await fill(store)
        where = RowFilter(since=T0)
        inputs = await load(store, config_from_dict(RAW), where)
        return build_report(await store.fetch(where), resamples=10, quality=inputs)
    finally:
        await store.close()


async def test_verdicts_recorded_make_the_reports_figures(ledger_target: str) -> None:
    quality = (await report_of(ledger_target))["quality"]
    assert (quality["judge_version"], quality["other_versions"]) == (JUDGE_VERSION, 1)
    assert (quality["verdicts"], quality["no_verdict"]) == (4, 1)
    greeting, translate = quality["groups"]
    assert greeting == {"route": "chat", "intent": "greeting", "language": "en",
                        "verdicts": 3, "no_verdict": 1, "non_loss": approx(2 / 3),
                        "low": approx(0.207655, abs=1e-6), "high": approx(0.938510, abs=1e-6),
                        "saved": approx(0.019)}
    assert (translate["intent"], translate["language"], translate["non_loss"]) == (
        "translate", "zh", 1.0)
    (route,) = quality["routes"]
    assert {k: v for k, v in route.items() if k != "thresholds"} == {
        "route": "chat", "small_backend": "small", "min_confidence": 0.85, "classified": 4,
        "saved_known": True}
    lines = {t["min_confidence"]: t for t in route["thresholds"]}
    expected = {  # level: (share moved, verdicts, non-loss, saved)
        0.5: (1.0, 4, 0.75, 0.020), 0.6: (0.75, 4, 0.75, 0.016), 0.7: (0.75, 4, 0.75, 0.016),
        0.8: (0.5, 4, 0.75, 0.013), 0.85: (0.5, 4, 0.75, 0.013), 0.9: (0.25, 2, 0.5, 0.008),
        0.95: (0.25, 1, 1.0, 0.008)}
    assert list(lines) == list(expected)
    for level, (share, verdicts, non_loss, saved) in expected.items():
        t = lines[level]
        assert (t["share_moved"], t["verdicts"], t["non_loss"]) == (share, verdicts, non_loss)
        assert t["saved"] == approx(saved), level


@pytest.mark.parametrize(("row", "down", "saving"), [
    (req("moved", 0.9, "small", cost=0.002, counterfactual=0.010), None, 0.008),
    # per-token small price: the same tokens
    (req("stayed", 0.9, "big", cost=0.005, tokens=(1000, 500), slot_s=5),
     Downgrade("small", PriceConfig(input_per_mtok=1.0, output_per_mtok=2.0), 4,
               frozenset(), 0.8), 0.003),
    # GPU-time small price: the same slot time, 5 s at 1.8 x 1 / 3600 / 1 a slot-second
    (req("stayed", 0.9, "big", cost=0.005, slot_s=5),
     Downgrade("small", PriceConfig(gpu_hour=1.8, gpus=1), 1, frozenset(), 0.8), 0.0025),
    (req("stayed", 0.9, "big", cost=0.005), Downgrade("small", None, 1, frozenset(), 0.8),
     0.005),  # an unpriced small backend costs nothing
    (req("stayed", 0.9, "big", cost=0.005), None, None),  # no small backend known
    (req("stayed", 0.9, "big", cost=0.005), Downgrade(None, None, 1, frozenset(), None),
     None),
])
def test_what_moving_a_request_saves(row: LedgerRow, down: Downgrade | None,
                                     saving: float | None) -> None:
    assert move_saving(row, down) == (None if saving is None else approx(saving))


async def test_unknown_savings_are_shown_as_unknown(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "ledger.sqlite3"))
    await store.open()
    try:
        await fill(store)
        inputs = await load(store, config_from_dict({**RAW, "routes": {"other": {
            "primary": "big"}}}), RowFilter(since=T0))
        report = build_report(await store.fetch(RowFilter()), resamples=10, quality=inputs)
    finally:
        await store.close()
    (route,) = report["quality"]["routes"]
    assert (route["small_backend"], route["saved_known"]) == (None, False)
    assert {t["saved"] for t in route["thresholds"]} == {None}
    assert "unknown: the config names no small backend" in render_text(report)


def test_no_verdicts_no_quality_section() -> None:
    report = build_report(requests(), resamples=10)
    assert "quality" not in report
    assert GROUPS_TITLE not in render_text(report) and GROUPS_TITLE not in render_html(report)
    assert "judge_version" not in render_csv(report)


async def test_slotgate_report_shows_the_quality_tables(
        ledger_target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from router.report.cli import report_main

    store = open_store(ledger_target)
    await store.open()
    try:
        await fill(store)
    finally:
        await store.close()
    config = tmp_path / "slotgate.yaml"
    config.write_text(yaml.safe_dump(RAW))
    argv = ["--config", str(config), "--ledger", ledger_target, "--since",
            "2023-11-14T22:13:20"]

    async def run(*extra: str) -> str:
        assert await asyncio.to_thread(report_main, [*argv, *extra]) == 0
        return capsys.readouterr().out

    data = orjson.loads(await run("--json"))
    assert data["quality"]["verdicts"] == 4 and data["quality"]["groups"][0]["saved"] == \
        approx(0.019)
    text = (await run()).splitlines()
    assert all(len(line) <= 100 for line in text)
    at = text.index(GROUPS_TITLE)
    assert "Judge pairwise-1, both orders (1 verdict of other judge versions left out)" \
        in " ".join(text[at + 1:at + 4])
    greeting = next(line for line in text[at:] if line.startswith("  greeting"))
    assert greeting.split() == ["greeting", "en", "3", "66.7%", "20.8-93.9%", "1", "0.0190"]
    at = text.index(thresholds_title({"route": "chat"}))
    assert "Now 0.85, small backend small; 4 classified requests" in text[at + 1]
    now = next(line for line in text[at:] if line.startswith("0.85 (now)"))
    assert now.split() == ["0.85", "(now)", "50.0%", "75.0%", "30.1-95.4%", "4", "0.0130"]
    table = list(csv.DictReader(io.StringIO(await run("--csv"))))
    quality = [r for r in table if r["scope"] == "quality"]
    assert [(r["route"], r["intent"], r["language"], r["verdicts"]) for r in quality] == [
        ("chat", "greeting", "en", "3"), ("chat", "translate", "zh", "1")]
    levels = [r for r in table if r["scope"] == "threshold"]
    assert [r["min_confidence"] for r in levels] == ["0.5", "0.6", "0.7", "0.8", "0.85",
                                                     "0.9", "0.95"]
    assert (levels[4]["share_moved"], levels[4]["judge_version"]) == ("0.5", "pairwise-1")
    assert all(r["judge_version"] == "" for r in table if r["scope"] == "total")
    page_file = tmp_path / "report.html"
    await run("--html", str(page_file))
    page = page_file.read_text(encoding="utf-8")
    assert f"<h2>{GROUPS_TITLE.replace(chr(39), '&#x27;')}</h2>" in page
    assert ("<td>0.85 (now)</td><td>50.0%</td><td>75.0%</td><td>30.1-95.4%</td><td>4</td>"
            "<td>0.0130</td>") in page


async def test_admin_report_has_the_quality(sdk: SdkClients, start: StartGateway,
                                            tmp_path: Path) -> None:
    raw = gateway_config(sim_backend("m-big", slots=2), sim_backend("m-small", slots=2))
    raw["ledger"] = {"path": str(tmp_path / "ledger.sqlite3")}
    gw = await start(raw)
    await sdk(gw).chat.completions.create(model="chat", messages=MESSAGES)
    await assert_idle(gw)
    assert gw.gateway.ledger is not None
    await record(gw.gateway.ledger.store, judged(0.9, Verdict.BETTER, 0.5, dt=0))
    await record(gw.gateway.ledger.store, judged(0.9, Verdict.TIE, 0.5, dt=0,
                                                 intent="<b>"))
    async with aiohttp.ClientSession() as http:
        async with http.get(gw.url + "/admin/report") as resp:
            assert resp.status == 200
            quality = (await resp.json())["quality"]
    assert quality["verdicts"] == 2
    assert {g["intent"] for g in quality["groups"]} == {"greeting", "<b>"}
    (route,) = quality["routes"]
    assert (route["route"], route["small_backend"], route["min_confidence"]) == (
        "chat", "small", None)  # the route never moves simple requests (when: never)


def test_ledger_strings_are_escaped_in_the_page() -> None:
    rows = [VerdictRow(ts=T0, route="<chat>", intent="<i>", language="en", p_simple=0.9,
                       prompt_tokens=3, verdict=Verdict.TIE, saved=0.0)]
    report = build_report(requests(), resamples=10, quality=QualityInputs(rows, {}))
    page = render_html(report)
    assert "<td>&lt;i&gt;</td>" in page and "&lt;chat&gt;" in page
    assert "<i>" not in page and "<chat>" not in page


async def test_verdicts_and_their_texts_go_after_the_ledgers_retention(
        ledger_target: str) -> None:
    store = open_store(ledger_target)
    await store.open()
    try:
        old, new = VERDICTS[0], VERDICTS[1]
        await record(store, replace(old, ts=T0, texts=("q", "s", "p")))
        await record(store, replace(new, ts=T0 + 2 * 86_400, texts=("q2", "s2", "p2")),
                     retention_days=1)
        assert [r.ts for r in await fetch(store, None, None)] == [T0 + 2 * 86_400]
        assert await store.run("SELECT question FROM verdict_texts") == [("q2",)]
    finally:
        await store.close()
