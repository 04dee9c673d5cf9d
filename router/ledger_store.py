"""Ledger stores: SQLite (the default, one file) and the choice between it and PostgreSQL.

The SQLite store keeps one connection on one worker thread, so every statement runs
off the event loop and in order. WAL mode lets `slotgate report` read while the
gateway writes. The schema is created and migrated here, in numbered steps recorded
in `schema_migrations`.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from policies.config import LedgerConfig
from router.config import from_env
from router.ledger import COLUMNS, Ledger, LedgerRow, RowFilter, Store, row_values

T = TypeVar("T")

# Portable column types: SQLite reads these as affinities, PostgreSQL as they are.
_TYPES = {
    "id": "TEXT PRIMARY KEY", "ts": "DOUBLE PRECISION NOT NULL", "request_id": "TEXT NOT NULL",
    "endpoint": "TEXT NOT NULL", "stream": "BOOLEAN NOT NULL", "status": "INTEGER NOT NULL",
    "p_simple": "DOUBLE PRECISION", "queue_wait_ms": "DOUBLE PRECISION NOT NULL",
    "ttft_ms": "DOUBLE PRECISION", "total_ms": "DOUBLE PRECISION NOT NULL",
    "slot_ms": "DOUBLE PRECISION NOT NULL", "prompt_tokens": "INTEGER NOT NULL",
    "completion_tokens": "INTEGER NOT NULL", "tokens_estimated": "BOOLEAN NOT NULL",
    "cost": "DOUBLE PRECISION NOT NULL", "counterfactual_cost": "DOUBLE PRECISION NOT NULL",
}
_V1_COLUMNS = COLUMNS[:COLUMNS.index("key_id")]  # the table as step 1 made it
_CREATE = "CREATE TABLE requests (\n  " + ",\n  ".join(
    f'"{name}" {_TYPES.get(name, "TEXT")}' for name in _V1_COLUMNS) + "\n)"
COLUMN_LIST = ", ".join(f'"{name}"' for name in COLUMNS)  # quoted: "primary" is a keyword

# Each step runs once, in order, in one transaction with its version record.
MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, (_CREATE,
         "CREATE INDEX requests_ts ON requests (ts)",
         "CREATE INDEX requests_experiment_ts ON requests (experiment, ts)")),
    (2, ("ALTER TABLE requests ADD COLUMN key_id TEXT",
         "CREATE INDEX requests_key_ts ON requests (key_id, ts)")),
)
# What each key spent since a time (for budgets, read at startup).
SPENT = ("SELECT key_id, SUM(prompt_tokens + completion_tokens), SUM(cost) FROM requests "
         "WHERE ts >= {mark} AND key_id IS NOT NULL GROUP BY key_id")
SCHEMA_VERSION = MIGRATIONS[-1][0]
# The oldest rows beyond the newest N: the cut is found by walking the ts index from the
# newest end, so the cost is that of N index entries, not a sort of the table.
TRIM = ("DELETE FROM requests WHERE ts < (SELECT ts FROM requests ORDER BY ts DESC "
        "LIMIT 1 OFFSET {mark})")


def where_clause(where: RowFilter, mark: Callable[[int], str]) -> tuple[str, list[object]]:
    """SQL conditions for a filter; `mark(i)` spells the i-th placeholder (1-based)."""
    terms: list[str] = []
    args: list[object] = []
    for column, op, value in (("ts", ">=", where.since), ("ts", "<", where.until),
                              ("experiment", "=", where.experiment),
                              ("route", "=", where.route)):
        if value is not None:
            args.append(value)
            terms.append(f"{column} {op} {mark(len(args))}")
    return (" WHERE " + " AND ".join(terms) if terms else ""), args


def open_ledger(config: LedgerConfig) -> Ledger:
    """The configured ledger (not yet started)."""
    target = from_env(config.target, config.url_env, "ledger.url_env")
    assert target is not None, "no ledger configured"
    retention = config.retention_days * 86_400 if config.retention_days is not None else None
    return Ledger(open_store(target), config.batch_rows, config.flush_interval_s,
                  config.max_pending_rows, retention, config.max_rows)


def open_store(target: str) -> Store:
    """A store for a SQLite path or a postgresql:// URL (not yet opened)."""
    if target.startswith(("postgresql://", "postgres://")):
        from router.ledger_postgres import PostgresStore

        return PostgresStore(target)
    return SQLiteStore(target)


class SQLiteStore:
    def __init__(self, path: str, busy_timeout_ms: int = 5000) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.name = f"sqlite:{path}"
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-sqlite")
        self._db: sqlite3.Connection | None = None

    async def _call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def open(self) -> None:
        await self._call(self._open)

    def _open(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes in WAL mode
        db.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_ms)}")
        db.execute("CREATE TABLE IF NOT EXISTS schema_migrations "
                   "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)")
        db.execute("BEGIN IMMEDIATE")  # one gateway migrates; the others wait, then see it done
        try:
            done = {v for (v,) in db.execute("SELECT version FROM schema_migrations")}
            for version, statements in MIGRATIONS:
                if version in done:
                    continue
                for statement in statements:
                    db.execute(statement)
                db.execute("INSERT INTO schema_migrations VALUES (?, ?)",
                           (version, time.time()))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            db.close()
            raise
        self._db = db

    async def write(self, rows: Sequence[LedgerRow]) -> None:
        values = [row_values(row) for row in rows]
        await self._call(lambda: self._write(values))

    def _write(self, values: list[tuple[object, ...]]) -> None:
        assert self._db is not None, "open() first"
        marks = ", ".join("?" * len(COLUMNS))
        with self._db:  # one transaction per batch
            self._db.execute("BEGIN")
            self._db.executemany(
                f"INSERT INTO requests ({COLUMN_LIST}) VALUES ({marks}) "
                "ON CONFLICT (id) DO NOTHING", values)

    async def fetch(self, where: RowFilter) -> list[LedgerRow]:
        return await self._call(lambda: self._fetch(where))

    def _fetch(self, where: RowFilter) -> list[LedgerRow]:
        assert self._db is not None, "open() first"
        clause, args = where_clause(where, lambda _: "?")
        cursor = self._db.execute(
            f"SELECT {COLUMN_LIST} FROM requests{clause} ORDER BY ts, id", args)
        return [_row(values) for values in cursor]

    async def purge(self, before_ts: float) -> int:
        def purge() -> int:
            assert self._db is not None, "open() first"
            with self._db:
                self._db.execute("BEGIN")
                return self._db.execute("DELETE FROM requests WHERE ts < ?",
                                        (before_ts,)).rowcount
        return await self._call(purge)

    async def trim(self, max_rows: int) -> int:
        def trim() -> int:
            assert self._db is not None, "open() first"
            with self._db:
                self._db.execute("BEGIN")
                return self._db.execute(TRIM.format(mark="?"), (max_rows - 1,)).rowcount
        return await self._call(trim)

    async def spent(self, since: float) -> dict[str, tuple[int, float]]:
        def spent() -> dict[str, tuple[int, float]]:
            assert self._db is not None, "open() first"
            rows = self._db.execute(SPENT.format(mark="?"), (since,))
            return {key: (int(tokens or 0), float(cost or 0)) for key, tokens, cost in rows}
        return await self._call(spent)

    async def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            await self._call(db.close)
        self._pool.shutdown(wait=True)


def _row(values: Sequence[object]) -> LedgerRow:
    row = LedgerRow(*values)  # type: ignore[arg-type]
    row.stream = bool(row.stream)  # SQLite keeps booleans as 0/1
    row.tokens_estimated = bool(row.tokens_estimated)
    return row
