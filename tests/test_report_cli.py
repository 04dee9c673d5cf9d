"""`slotgate report` as a user runs it: over a real SQLite ledger holding the hand-built rows
of tests/test_report.py, every format, the filters and the exit codes."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from router.ledger.base import LedgerRow
from tests.support import T0, hand_ledger

approx = pytest.approx


@pytest.fixture
def ledger_file(tmp_path: Path) -> str:
    """The hand-built ledger in a real SQLite ledger file."""
    import asyncio

    path = tmp_path / "ledger.db"
    asyncio.run(write_ledger(path, hand_ledger()))
    return str(path)


def test_cli_formats(ledger_file: str, tmp_path: Path,
                     capsys: pytest.CaptureFixture[str]) -> None:
    from router.report.cli import report_main

    assert report_main(["--ledger", ledger_file]) == 0
    assert "0.054286" in capsys.readouterr().out
    assert report_main(["--ledger", ledger_file, "--json", "--baseline", "on"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert data["header"]["baseline"] == "on" and data["total"]["requests"] == 14
    assert report_main(["--ledger", ledger_file, "--csv", "--route", "other"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("total,,,1,")
    page = tmp_path / "report.html"
    assert report_main(["--ledger", ledger_file, "--html", str(page)]) == 0
    assert page.read_text(encoding="utf-8").startswith("<!doctype html>")


def test_cli_passes_the_filter(ledger_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    from router.report.cli import report_main

    argv = ["--ledger", ledger_file, "--json", "--since", "2023-11-14T22:13:30",
            "--until", "2023-11-14T22:14:00", "--experiment", "exp1"]
    assert report_main(argv) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert data["total"]["requests"] == 6  # ts 10, 15, 20, 25, 30, 35
    assert data["filter"]["since"] == T0 + 10
    assert report_main([a for a in argv if a != "--json"]) == 0  # as a table
    assert ("selected: since 2023-11-14T22:13:30+00:00, until 2023-11-14T22:14:00+00:00, "
            "experiment exp1") in capsys.readouterr().out


def test_cli_exit_codes(ledger_file: str, tmp_path: Path,
                        capsys: pytest.CaptureFixture[str]) -> None:
    from router.report.cli import report_main

    missing = str(tmp_path / "nowhere.db")
    assert report_main(["--ledger", missing]) == 1
    assert "no such ledger file" in capsys.readouterr().err
    assert report_main(["--ledger", ledger_file, "--experiment", "other"]) == 1
    assert "no requests match experiment other" in capsys.readouterr().err
    import asyncio

    empty = tmp_path / "empty.db"
    asyncio.run(write_ledger(empty, []))
    assert report_main(["--ledger", str(empty)]) == 1
    assert "holds no requests" in capsys.readouterr().err
    assert report_main(["--ledger", ledger_file, "--since", "last tuesday"]) == 2
    assert "ISO 8601" in capsys.readouterr().err
    assert report_main(["--ledger", ledger_file, "--baseline", "nope"]) == 2
    assert "'nope' is not an arm" in capsys.readouterr().err
    assert report_main(["--ledger", ledger_file, "--json", "--csv"]) == 2
    assert report_main(["--colour"]) == 2


def test_cli_needs_a_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from router.report.cli import report_main

    config = tmp_path / "slotgate.yaml"
    config.write_text("backends:\n  big: {simulated: {}, model: m, slots: 1}\n"
                      "routes:\n  chat: {primary: big}\n", encoding="utf-8")
    assert report_main(["--config", str(config)]) == 1
    assert "configures no ledger" in capsys.readouterr().err


async def write_ledger(path: Path, rows: list[LedgerRow]) -> None:
    from router.ledger.open import open_store

    store = open_store(str(path))
    await store.open()
    try:
        await store.write(rows)
    finally:
        await store.close()


def test_cli_reads_a_sqlite_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import asyncio

    from router.report.cli import report_main

    path = tmp_path / "ledger.db"
    asyncio.run(write_ledger(path, hand_ledger()))
    assert report_main(["--ledger", str(path), "--json", "--experiment", "exp1"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert data["total"]["requests"] == 13  # all but none1
    assert data["total"]["cost"] == approx(0.98)  # 0.6 + 0.38
    assert data["header"]["arms"] == ["off", "on"]
    missing = tmp_path / "missing.db"
    assert report_main(["--ledger", str(missing)]) == 1
    assert not missing.exists()  # looking does not create a ledger
