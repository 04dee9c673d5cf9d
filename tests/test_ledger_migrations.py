"""The ledger's migrations, on SQLite and the real PostgreSQL: each step applied to a ledger
in use keeps its rows (split from tests/test_ledger.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from policies.quality.judging import Verdict
from policies.quality.stats import VerdictRow
from router.ledger.base import COLUMNS, LedgerRow, RowFilter
from router.ledger.open import open_store
from router.ledger.schema import MIGRATIONS, SCHEMA_VERSION
from router.quality import verdicts
from tests.support.ledger_rows import numbered_row as row


async def test_a_first_version_ledger_is_migrated_with_its_rows(tmp_path: Path) -> None:
    path = str(tmp_path / "v1.sqlite3")
    with sqlite3.connect(path) as db:  # the table as the first release made it
        db.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, "
                   "applied_at DOUBLE PRECISION NOT NULL)")
        for statement in MIGRATIONS[0][1]:
            db.execute(statement)
        db.execute("INSERT INTO schema_migrations VALUES (1, 0)")
        old = row(1)
        columns = COLUMNS[:COLUMNS.index("key_id")]
        quoted = ", ".join(f'"{c}"' for c in columns)  # "primary" is a keyword
        db.execute(f"INSERT INTO requests ({quoted}) "
                   f"VALUES ({', '.join('?' * len(columns))})",
                   [getattr(old, c) for c in columns])
    store = open_store(path)
    await store.open()
    try:
        await store.write([row(2, key_id="team-a")])
        assert [(r.id, r.key_id) for r in await store.fetch(RowFilter())] == [
            ("row-1", None), ("row-2", "team-a")]
    finally:
        await store.close()


async def _make_old_ledger(target: str, old: LedgerRow, version: int = 2,
                          first_new: str = "replica") -> None:
    """A ledger as the release of schema `version` made it (steps 1 to `version`, without
    the column `first_new` and those after it), holding `old`."""
    steps = [(v, statements) for v, statements in MIGRATIONS if v <= version]
    columns = COLUMNS[:COLUMNS.index(first_new)]
    quoted = ", ".join(f'"{c}"' for c in columns)  # "primary" is a keyword
    values = [getattr(old, c) for c in columns]
    versions = "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, " \
               "applied_at DOUBLE PRECISION NOT NULL)"
    if not target.startswith("postgres"):
        with sqlite3.connect(target) as db:
            db.execute(versions)
            for version, statements in steps:
                for statement in statements:
                    db.execute(statement)
                db.execute("INSERT INTO schema_migrations VALUES (?, 0)", (version,))
            db.execute(f"INSERT INTO requests ({quoted}) "
                       f"VALUES ({', '.join('?' * len(columns))})", values)
        return
    import asyncpg

    db = await asyncpg.connect(target)
    try:
        await db.execute(versions)
        for version, statements in steps:
            for statement in statements:
                await db.execute(statement)
            await db.execute("INSERT INTO schema_migrations VALUES ($1, 0)", version)
        marks = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
        await db.execute(f"INSERT INTO requests ({quoted}) VALUES ({marks})", *values)
    finally:
        await db.close()


async def test_a_ledger_without_replicas_is_migrated_in_place(ledger_target: str) -> None:
    """Rows written before the ledger kept the replica read back with replica None."""
    await _make_old_ledger(ledger_target, row(1, key_id="team-a"))
    store = open_store(ledger_target)
    await store.open()
    try:
        await store.write([row(2, replica="big-1"), row(3, backend="small", replica="small")])
        got = await store.fetch(RowFilter())
        assert [(r.id, r.key_id, r.replica) for r in got] == [
            ("row-1", "team-a", None), ("row-2", None, "big-1"), ("row-3", None, "small")]
        # The old row unchanged otherwise (its usage never checked: None, not False).
        assert got[0] == row(1, key_id="team-a", usage_rejected=None, batch=None)
        assert got[1].usage_rejected is False
    finally:
        await store.close()
    reopened = open_store(ledger_target)  # a restart finds the step done and runs it no more
    await reopened.open()
    try:
        assert len(await reopened.fetch(RowFilter())) == 3
    finally:
        await reopened.close()


async def test_a_ledger_without_objectives_is_migrated_in_place(ledger_target: str) -> None:
    """Step 4 on a ledger of schema 3: rows written before it read back without a class,
    an objective or a forecast; new rows keep all three."""
    await _make_old_ledger(ledger_target, row(1, replica="big-0"), version=3,
                           first_new="priority")
    store = open_store(ledger_target)
    await store.open()
    try:
        kept = row(2, priority="critical", slo_ttft_ms=2000.0, predicted_ttft_ms=412.5)
        await store.write([kept])
        got = await store.fetch(RowFilter())
        assert [(r.id, r.priority, r.slo_ttft_ms, r.predicted_ttft_ms) for r in got] == [
            ("row-1", None, None, None), ("row-2", "critical", 2000.0, 412.5)]
        assert got[0] == row(1, replica="big-0", usage_rejected=None, batch=None) and got[1] == kept
    finally:
        await store.close()
    reopened = open_store(ledger_target)  # a restart finds every step done
    await reopened.open()
    try:
        assert len(await reopened.fetch(RowFilter())) == 2
    finally:
        await reopened.close()
    assert SCHEMA_VERSION >= 4


async def test_a_ledger_without_usage_checks_is_migrated_in_place(ledger_target: str) -> None:
    """Step 6 on a ledger of schema 5: rows written before it read back with
    usage_rejected None (never checked); new rows keep the flag, set or not."""
    await _make_old_ledger(ledger_target, row(1, api="chat"), version=5,
                           first_new="usage_rejected")
    store = open_store(ledger_target)
    await store.open()
    try:
        await store.write([row(2, usage_rejected=True, tokens_estimated=True), row(3)])
        got = await store.fetch(RowFilter())
        assert [(r.id, r.usage_rejected) for r in got] == [
            ("row-1", None), ("row-2", True), ("row-3", False)]
    finally:
        await store.close()
    assert SCHEMA_VERSION >= 6


async def _indexes(target: str) -> set[str]:
    """The names of the requests table's indexes (those a statement made)."""
    if not target.startswith("postgres"):
        with sqlite3.connect(target) as db:
            return {name for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' "
                "AND tbl_name = 'requests' AND sql IS NOT NULL")}
    import asyncpg

    db = await asyncpg.connect(target)
    try:
        return {r["indexname"] for r in await db.fetch(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'requests'")} - {
            "requests_pkey"}
    finally:
        await db.close()


async def test_step_7_keeps_only_the_time_index(ledger_target: str) -> None:
    """Step 7 on a ledger of schema 6 drops the experiment and key indexes (each a B-tree
    every row was written into); the rows stay, and the reads they served still answer
    through the time index: an experiment's rows, a key's spend."""
    await _make_old_ledger(ledger_target, row(1, key_id="team-a"), version=6,
                           first_new="usage_rejected")
    assert await _indexes(ledger_target) == {"requests_ts", "requests_experiment_ts",
                                             "requests_key_ts"}
    store = open_store(ledger_target)
    await store.open()
    try:
        await store.write([row(2, experiment="other", key_id="team-a"), row(3)])
        assert await _indexes(ledger_target) == {"requests_ts"}
        got = await store.fetch(RowFilter(experiment="ab", since=1_700_000_000.0))
        assert [r.id for r in got] == ["row-1", "row-3"]
        assert (await store.spent(0.0))["team-a"][0] == (10 + 1 + 100 + 1) + (10 + 2 + 100 + 2)
    finally:
        await store.close()
    assert SCHEMA_VERSION >= 7


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/other"])
async def test_a_ledger_without_apis_is_migrated_in_place(ledger_target: str,
                                                          path: str) -> None:
    """Step 5 on a ledger of schema 4: a row written before it gets its API from its path
    (None for a path of no known API); new rows keep theirs."""
    old = row(1, endpoint=path, priority="standard")
    await _make_old_ledger(ledger_target, old, version=4, first_new="api")
    store = open_store(ledger_target)
    await store.open()
    try:
        kept = row(2, endpoint="/v1/embeddings", api="embeddings", completion_tokens=0)
        await store.write([kept])
        got = await store.fetch(RowFilter())
        migrated = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
        assert [(r.id, r.api) for r in got] == [("row-1", migrated.get(path)),
                                                ("row-2", "embeddings")]
        assert got[0] == row(1, endpoint=path, priority="standard", api=migrated.get(path),
                             usage_rejected=None, batch=None)
        assert got[1] == kept
    finally:
        await store.close()
    reopened = open_store(ledger_target)  # a restart finds every step done
    await reopened.open()
    try:
        assert len(await reopened.fetch(RowFilter())) == 2
    finally:
        await reopened.close()
    assert SCHEMA_VERSION >= 5


async def test_a_ledger_without_batch_marks_is_migrated_in_place(ledger_target: str) -> None:
    """Step 11 on a ledger of the steps before it: rows written before it read back with
    batch None (not known); new rows keep the mark, set or not."""
    await _make_old_ledger(ledger_target, row(1, api="chat", usage_rejected=True),
                           version=10, first_new="batch")
    store = open_store(ledger_target)
    await store.open()
    try:
        await store.write([row(2, batch=True, priority="sheddable"), row(3)])
        got = await store.fetch(RowFilter())
        assert [(r.id, r.batch) for r in got] == [("row-1", None), ("row-2", True),
                                                  ("row-3", False)]
        assert got[0] == row(1, api="chat", usage_rejected=True, batch=None)
    finally:
        await store.close()
    assert SCHEMA_VERSION >= 11


async def test_step_12_adds_the_verdicts_table_to_a_ledger_in_use(ledger_target: str) -> None:
    """Step 12 on a ledger of the steps before it: its requests stay, and the judge's
    verdicts are written and read beside them."""
    await _make_old_ledger(ledger_target, row(1), version=11, first_new="key_id")
    store = open_store(ledger_target)
    await store.open()
    try:
        assert [r.id for r in await store.fetch(RowFilter())] == ["row-1"]
        await verdicts.record(store, verdicts.VerdictRecord(
            request_id="req-1", tenant=None, route="chat", intent="greeting", language="en",
            p_simple=0.93, prompt_tokens=11, small_backend="small", primary_backend="big",
            verdict=Verdict.TIE, saved=0.5, ts=1_700_000_001.0))
        assert await verdicts.fetch(store, None, None) == [VerdictRow(
            ts=1_700_000_001.0, route="chat", intent="greeting", language="en",
            p_simple=0.93, prompt_tokens=11, verdict=Verdict.TIE, saved=0.5)]
        tables = await store.run("SELECT COUNT(*) FROM schema_migrations WHERE version = 12")
        assert tables == [(1,)]
    finally:
        await store.close()
    assert SCHEMA_VERSION >= 12
