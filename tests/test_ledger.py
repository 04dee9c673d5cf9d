"""The ledger stores (SQLite and the real PostgreSQL) and the batching writer."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from router.ledger.base import Ledger, RowFilter
from router.ledger.open import open_store
from router.ledger.schema import MIGRATIONS
from router.ledger.sqlite import ROWS_PER_INSERT, SQLiteStore, statement_sizes
from tests.support.ledger_rows import numbered_row as row


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
