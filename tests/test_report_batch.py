"""The report's batch work (router/report/batch.py): each tenant's batch tokens and cost
beside its interactive ones, each backend's batch slot time and the idle capacity it filled
over the rows' window, in JSON, text and HTML, and through `slotgate report`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
import yaml

from router.ledger.base import LedgerRow
from router.ledger.open import open_store
from router.report.batch_tables import BACKENDS_TITLE, TENANTS_TITLE
from router.report.build import build_report
from router.report.render import render_html, render_text
from tests.support import T0, hand_ledger, row


def of(key: str, dt: float, tenant: str | None, backend: str | None, *, slot_s: float,
       batch: bool | None = False, tokens: tuple[int, int] = (10, 20), cost: float = 0.0,
       total_s: float | None = None) -> LedgerRow:
    """A served row `dt` s after T0 that held a slot `slot_s` s and ran `total_s` s."""
    return row(key, dt, None, backend, tokens=tokens, cost=cost, experiment=None)._replace(
        tenant=tenant, slot_ms=slot_s * 1000, total_ms=(total_s or slot_s) * 1000,
        batch=batch)


def batch_ledger() -> list[LedgerRow]:
    """100 s from the first arrival to the last end; "big" has 2 slots in the config, held
    50 s by interactive requests and 75 s by batch lines: 150 slot-seconds were idle, and
    the lines filled half of them. "gone" is no longer configured."""
    return [
        of("i1", 0, "alice", "big", slot_s=20, cost=0.4),
        of("i2", 10, "bob", "big", slot_s=30, tokens=(100, 200), cost=0.6),
        of("b1", 5, "alice", "big", slot_s=40, batch=True, tokens=(50, 50), cost=0.1),
        of("b2", 50, "alice", "big", slot_s=35, batch=True, tokens=(30, 70), cost=0.05),
        of("old", 60, None, "gone", slot_s=5, batch=None),  # before the ledger kept the mark
        of("g1", 90, "<bob>", "gone", slot_s=2, batch=True, cost=0.01, total_s=10),
        of("r1", 95, "bob", None, slot_s=0),  # refused: no slot held
    ]


def test_each_tenants_batch_work_beside_its_interactive_work() -> None:
    batch = build_report(batch_ledger(), slots={"big": 2}, resamples=10)["batch"]
    tenants = {t["tenant"]: t for t in batch["tenants"]}
    assert list(tenants) == ["alice", "<bob>", "bob", "(none)"]  # most batch tokens first
    assert tenants["alice"]["batch"] == {"requests": 2, "tokens": 200,
                                         "cost": pytest.approx(0.15)}
    assert tenants["alice"]["interactive"] == {"requests": 1, "tokens": 30,
                                               "cost": pytest.approx(0.4)}
    assert tenants["bob"]["batch"] == {"requests": 0, "tokens": 0, "cost": 0.0}
    assert tenants["bob"]["interactive"]["requests"] == 2  # its refused request too
    assert tenants["(none)"]["interactive"]["requests"] == 1  # a row without the mark


def test_the_idle_capacity_batch_lines_filled_per_backend() -> None:
    batch = build_report(batch_ledger(), slots={"big": 2}, resamples=10)["batch"]
    assert batch["window"] == {"start_ts": T0, "end_ts": T0 + 100, "seconds": 100}
    big, gone = batch["backends"]
    assert big == {"backend": "big", "slots": 2, "batch_lines": 2,
                   "interactive_slot_s": 50, "batch_slot_s": 75, "idle_slot_s": 150,
                   "idle_filled": 0.5}
    assert (gone["backend"], gone["slots"], gone["idle_slot_s"], gone["idle_filled"],
            gone["batch_slot_s"], gone["interactive_slot_s"]) == ("gone", None, None, None,
                                                                  2, 5)


def test_a_backend_with_no_idle_time_has_no_share() -> None:
    rows = [of("i1", 0, "a", "big", slot_s=10), of("b1", 0, "a", "big", slot_s=10, batch=True)]
    (big,) = build_report(rows, slots={"big": 1}, resamples=10)["batch"]["backends"]
    assert (big["idle_slot_s"], big["idle_filled"]) == (0, None)


def test_no_batch_line_no_batch_section() -> None:
    report = build_report(hand_ledger(), slots={"big": 2}, resamples=10)
    assert "batch" not in report
    assert TENANTS_TITLE not in render_text(report)
    assert TENANTS_TITLE not in render_html(report)


def test_the_text_and_html_tables() -> None:
    report = build_report(batch_ledger(), slots={"big": 2}, resamples=10)
    text = render_text(report).splitlines()
    assert all(len(line) <= 100 for line in text)
    at = text.index(TENANTS_TITLE)
    assert text[at + 2].split() == ["alice", "1", "30", "0.4000", "2", "200", "0.1500"]
    at = text.index(BACKENDS_TITLE)
    assert "Window 100.0 s" in text[at + 1]
    assert "Idle = slots x window - interactive slot-seconds" in " ".join(text[at + 1:at + 4])
    big = next(line for line in text[at:] if line.startswith("big "))
    assert big.split() == ["big", "2", "50.0", "150.0", "75.0", "2", "50.0%"]
    gone = next(line for line in text[at:] if line.startswith("gone "))
    assert gone.split() == ["gone", "-", "5.0", "-", "2.0", "1", "-"]
    page = render_html(report)
    assert f"<h2>{TENANTS_TITLE.replace(chr(39), '&#x27;')}</h2>" in page
    assert "<td>&lt;bob&gt;</td>" in page and "<bob>" not in page
    assert "<td>big</td><td>2</td><td>50.0</td><td>150.0</td><td>75.0</td><td>2</td>" \
           "<td>50.0%</td>" in page


def test_slotgate_report_shows_the_batch_work(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The slots come from the config the command reads."""
    from router.report.cli import report_main

    ledger = tmp_path / "ledger.sqlite3"
    asyncio.run(_write(ledger, batch_ledger()))
    config = tmp_path / "slotgate.yaml"
    config.write_text(yaml.safe_dump({
        "backends": {"big": {"simulated": {}, "model": "m", "slots": 2}},
        "routes": {"chat": {"primary": "big"}}, "ledger": {"path": str(ledger)}}))
    assert report_main(["--config", str(config), "--json"]) == 0
    big = orjson.loads(capsys.readouterr().out)["batch"]["backends"][0]
    assert (big["backend"], big["idle_filled"]) == ("big", 0.5)
    assert report_main(["--config", str(config)]) == 0
    assert BACKENDS_TITLE in capsys.readouterr().out


async def _write(path: Path, rows: list[LedgerRow]) -> None:
    store = open_store(str(path))
    await store.open()
    try:
        await store.write(rows)
    finally:
        await store.close()


def test_batch_rows_are_in_no_arm_of_an_experiment() -> None:
    """An experiment's arms compare interactive traffic: a batch line (or a shadow
    comparison's call) on the route forms no arm of its own, and counts in the total."""
    rows = [row("a", 0, "on", "big"), row("b", 1, "off", "big"),
            of("x", 2, None, "big", slot_s=1, batch=True)]
    report = build_report(rows, resamples=10)
    assert sorted(report["header"]["arms"]) == ["off", "on"]
    assert report["total"]["requests"] == 3
