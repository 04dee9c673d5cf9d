"""The SQLite ledger store (the default, one file).

It keeps one connection on one worker thread, so every statement runs off the event
loop and in order. WAL mode lets `slotgate report` read while the gateway writes. The
schema (`router.ledger.schema`) is created and migrated here, in numbered steps recorded
in `schema_migrations`.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from pathlib import Path
from typing import TypeVar, cast

from router.ledger.base import COLUMNS, LedgerRow, RowFilter
from router.ledger.schema import COLUMN_LIST, MIGRATIONS, SPENT, TRIM, where_clause

T = TypeVar("T")
# Rows per INSERT statement: their values bound at once (3,500 of SQLite's 32,766), then
# one step. executemany steps once per row, and the sqlite3 module takes the GIL back
# after each step: with the event loop holding it, a batch of 500 rows cost 500 hand-offs
# of the GIL between the two threads (a futex call per row, seen with strace), and the
# writer three times its own CPU. Same CPU alone: bench/ledger_cost.py.
ROWS_PER_INSERT = 100


def _bind_plainly() -> None:
    """Let the sqlite3 module bind a row's None and bool values without looking for an
    adapter. It binds an exact int, float or str directly; any other value (None, a bool)
    costs a failed lookup in its adapters and two failed attribute lookups on the value
    before it is bound as it is: a third of the writer's CPU per row, as a ledger row holds
    a dozen of them. Registered, the lookup finds C callables that return what the module
    would have bound anyway (1 or 0; None, which binds NULL). SQLite per row, 30,000 rows
    in 100-row INSERTs: 9.2 -> 5.7 us. Process-wide, as the module's adapters are."""
    sqlite3.register_adapter(bool, int)
    sqlite3.register_adapter(type(None), _NULL)


_NULL = cast(Callable[[None], None], {}.get)  # a C callable: None for any value


# Sizes of the INSERTs a batch is cut into: full ones, then the rest by powers of two. The
# sqlite3 module keeps each statement it prepared, and a statement of 100 rows' 3,300
# values holds about 0.3 MB: one per row count from 1 to 100 held 16 MB of the gateway's
# memory. These eight hold 0.7 MB.
_PARTS = tuple(1 << bit for bit in range(ROWS_PER_INSERT.bit_length() - 1, -1, -1))


def statement_sizes(rows: int) -> list[int]:
    """The row counts of the INSERTs that write `rows` rows."""
    sizes = [ROWS_PER_INSERT] * (rows // ROWS_PER_INSERT)
    rest = rows % ROWS_PER_INSERT
    sizes.extend(part for part in _PARTS if rest & part)
    return sizes


@functools.lru_cache(maxsize=len(_PARTS) + 1)
def _insert(rows: int) -> str:
    """The INSERT of `rows` rows (a row already there is kept: a batch may be sent twice)."""
    one = "(" + ", ".join("?" * len(COLUMNS)) + ")"
    return (f"INSERT INTO requests ({COLUMN_LIST}) VALUES {', '.join([one] * rows)} "
            "ON CONFLICT (id) DO NOTHING")

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
        _bind_plainly()
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
        await self._call(lambda: self._write(rows))

    def _write(self, values: Sequence[tuple[object, ...]]) -> None:
        assert self._db is not None, "open() first"
        with self._db:  # one transaction per batch
            self._db.execute("BEGIN")
            start = 0
            for rows in statement_sizes(len(values)):
                part = values[start:start + rows]
                self._db.execute(_insert(rows), tuple(chain.from_iterable(part)))
                start += rows

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

    async def run(self, sql: str, args: Sequence[object] = ()) -> list[tuple[object, ...]]:
        def run() -> list[tuple[object, ...]]:
            assert self._db is not None, "open() first"
            with self._db:
                self._db.execute("BEGIN")
                return self._db.execute(sql, tuple(args)).fetchall()
        return await self._call(run)

    async def run_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        def run_many() -> None:
            assert self._db is not None, "open() first"
            with self._db:
                self._db.execute("BEGIN")
                self._db.executemany(sql, [tuple(row) for row in rows])
        await self._call(run_many)

    async def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            await self._call(db.close)
        self._pool.shutdown(wait=True)


def _row(values: Sequence[object]) -> LedgerRow:
    row = LedgerRow(*values)  # type: ignore[arg-type]
    rejected, batch = row.usage_rejected, row.batch
    return row._replace(stream=bool(row.stream),  # SQLite keeps booleans as 0/1
                        tokens_estimated=bool(row.tokens_estimated),
                        usage_rejected=None if rejected is None else bool(rejected),
                        batch=None if batch is None else bool(batch))
