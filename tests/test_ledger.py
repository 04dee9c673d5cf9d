"""The ledger stores (SQLite and the real PostgreSQL) and the batching writer."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from policies.quality.judging import Verdict
from policies.quality.stats import VerdictRow
from router.ledger.base import COLUMNS, Ledger, LedgerRow, RowFilter
from router.ledger.open import open_store
from router.ledger.schema import MIGRATIONS, SCHEMA_VERSION
from router.ledger.sqlite import ROWS_PER_INSERT, SQLiteStore, statement_sizes
from router.quality import verdicts


def row(i: int, **fields: object) -> LedgerRow:
    base: dict[str, object] = dict(
        id=f"row-{i}", ts=1_700_000_000.0 + i, request_id=f"req-{i}", endpoint="chat",
        route="chat", primary="big", experiment="ab", arm="on" if i % 2 else "off",
        tenant="3f2a9c0d1e4b", backend="small" if i % 3 == 0 else "big", reason="primary",
        intent="greeting", p_simple=0.93, stream=bool(i % 2), status=200, error=None,
        disconnect=None, queue_wait_ms=12.5 * i, ttft_ms=80.25, total_ms=900.5,
        slot_ms=850.0, prompt_tokens=10 + i, completion_tokens=100 + i,
        tokens_estimated=False, cost=0.00125 * i, counterfactual_cost=0.0025 * i,
    )
    base.update(fields)
    return LedgerRow(**base)  # type: ignore[arg-type]


async def test_rows_round_trip(ledger_target: str) -> None:
    store = open_store(ledger_target)
    await store.open()
    try:
        rows = [row(i) for i in range(1, 6)]
        rows.append(row(6, route=None, primary=None, experiment=None, arm=None, tenant=None,
                        backend=None, reason=None, intent=None, p_simple=None, status=400,
                        error="invalid_request_error", ttft_ms=None, tokens_estimated=True,
                        disconnect="queued"))
        await store.write(rows)
        assert await store.fetch(RowFilter()) == rows
    finally:
        await store.close()


async def test_writing_a_batch_twice_keeps_one_copy(ledger_target: str) -> None:
    store = open_store(ledger_target)
    await store.open()
    try:
        batch = [row(i) for i in range(1, 21)]
        await store.write(batch)
        await store.write([*batch[5:], row(21)])  # a retry after a crash, plus one new row
        got = await store.fetch(RowFilter())
        assert [r.id for r in got] == [f"row-{i}" for i in range(1, 22)]
    finally:
        await store.close()


async def test_filters_and_retention(ledger_target: str) -> None:
    store = open_store(ledger_target)
    await store.open()
    try:
        await store.write([row(i) for i in range(1, 11)]
                          + [row(11, experiment="other", route="code")])
        t0 = 1_700_000_000.0
        window = await store.fetch(RowFilter(since=t0 + 3, until=t0 + 6))
        assert [r.id for r in window] == ["row-3", "row-4", "row-5"]  # since <=, until <
        assert [r.id for r in await store.fetch(RowFilter(experiment="other"))] == ["row-11"]
        assert len(await store.fetch(RowFilter(route="chat"))) == 10
        assert await store.purge(t0 + 8) == 7  # rows 1..7 are older than t0 + 8
        assert [r.id for r in await store.fetch(RowFilter())] == ["row-8", "row-9", "row-10",
                                                                  "row-11"]
    finally:
        await store.close()


async def test_schema_is_created_once_and_reopened(ledger_target: str) -> None:
    first, second = open_store(ledger_target), open_store(ledger_target)
    await first.open()
    await first.write([row(1)])
    await second.open()  # a second gateway (or a restart) finds the schema in place
    try:
        assert [r.id for r in await second.fetch(RowFilter())] == ["row-1"]
    finally:
        await first.close()
        await second.close()
    if not ledger_target.startswith("postgres"):
        with sqlite3.connect(ledger_target) as db:
            versions = [v for (v,) in db.execute("SELECT version FROM schema_migrations")]
            mode = db.execute("PRAGMA journal_mode").fetchone()[0]
        assert versions == [v for v, _ in MIGRATIONS] and mode == "wal"


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


async def test_spend_per_key_since_a_time(ledger_target: str) -> None:
    """What budgets are seeded from at startup: tokens and cost per key id."""
    store = open_store(ledger_target)
    await store.open()
    try:
        await store.write([row(i, key_id="team-a" if i % 2 else "team-b") for i in range(1, 7)]
                          + [row(7, key_id=None)])
        since = 1_700_000_000.0 + 3  # rows 3..7
        spent = await store.spent(since)
        assert set(spent) == {"team-a", "team-b"}
        assert spent["team-a"][0] == sum(10 + i + 100 + i for i in (3, 5))
        assert spent["team-b"][1] == pytest.approx(0.00125 * (4 + 6))
    finally:
        await store.close()


async def test_writer_batches_and_flushes_everything_on_close(ledger_target: str) -> None:
    ledger = Ledger(open_store(ledger_target), batch_rows=7, flush_interval_s=60)
    await ledger.start()
    for i in range(1, 51):
        ledger.add(row(i))
    await ledger.close()  # long before the 60 s interval: close writes what is held
    assert ledger.written == 50 and ledger.pending == 0
    store = open_store(ledger_target)
    await store.open()
    try:
        assert len(await store.fetch(RowFilter())) == 50
    finally:
        await store.close()


async def test_writer_keeps_rows_while_the_database_is_locked(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.sqlite3")
    ledger = Ledger(SQLiteStore(path, busy_timeout_ms=50), batch_rows=5, flush_interval_s=60)
    await ledger.start()
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    for i in range(1, 6):
        ledger.add(row(i))
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        await ledger.flush()
    assert ledger.pending == 5  # nothing lost
    blocker.execute("ROLLBACK")
    blocker.close()
    await ledger.close()
    assert ledger.written == 5


def test_pending_rows_are_bounded() -> None:
    ledger = Ledger(SQLiteStore(":memory:"), batch_rows=1000, max_pending=3)
    for i in range(1, 6):
        ledger.add(row(i))
    assert ledger.pending == 3 and ledger.dropped == 2


def test_the_gateways_ids_are_uuid7s_in_the_order_they_were_made() -> None:
    """Time-ordered keys: the ledger's key index grows at its end (a random key costs
    SQLite 2-3x the CPU per row once the table is large: bench/ledger_cost.py)."""
    import uuid

    from router.common.record import new_id

    ids = [new_id() for _ in range(2000)]
    assert all(len(i) == 32 and uuid.UUID(i).version == 7 for i in ids)
    assert all(uuid.UUID(i).variant == uuid.RFC_4122 for i in ids)
    assert len(set(ids)) == len(ids)
    stamps = [int(i[:12], 16) for i in ids]  # milliseconds: never out of order
    assert stamps == sorted(stamps)


def test_a_batch_is_cut_into_few_statement_sizes() -> None:
    """Every batch size is written whole, by INSERTs of at most eight row counts: the
    sqlite3 module keeps each statement it prepared (one of 100 rows holds about 0.3 MB),
    so one per row count would hold 16 MB."""
    seen: set[int] = set()
    for rows in range(0, 1001):
        sizes = statement_sizes(rows)
        assert sum(sizes) == rows and all(0 < size <= ROWS_PER_INSERT for size in sizes)
        seen.update(sizes)
    assert seen == {100, 64, 32, 16, 8, 4, 2, 1}


async def test_batches_of_every_size_are_written_whole(tmp_path: Path) -> None:
    store = SQLiteStore(str(tmp_path / "ledger.sqlite3"))
    await store.open()
    try:
        written = 0
        for size in (*range(1, 102), 250, 499):
            await store.write([row(written + i) for i in range(size)])
            written += size
        got = await store.fetch(RowFilter())
        assert [r.id for r in got] == [f"row-{i}" for i in range(written)]
    finally:
        await store.close()
