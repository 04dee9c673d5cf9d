"""The PostgreSQL ledger store, for several replicas writing to one place (asyncpg).

Replicas starting together migrate under a transaction-scoped advisory lock, so
the schema steps run exactly once. Writes are idempotent on the row id.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

from router.ledger.base import COLUMNS, LedgerRow, RowFilter
from router.ledger.schema import COLUMN_LIST, MIGRATIONS, SPENT, TRIM, where_clause

_LOCK_KEY = 0x5106_6A7E  # the advisory lock that serialises migrations
_CONNECT_TIMEOUT_S = 5.0
_COMMAND_TIMEOUT_S = 30.0


class PostgresStore:
    def __init__(self, url: str) -> None:
        self.url = url
        self.name = "postgresql"  # never the DSN: it may hold a password
        self._pool: Any = None

    async def open(self) -> None:
        try:
            import asyncpg
        except ImportError:
            raise RuntimeError("a postgresql:// ledger needs asyncpg: "
                               "pip install 'slotgate[postgres]'") from None
        self._pool = await asyncpg.create_pool(
            self.url, min_size=1, max_size=2, timeout=_CONNECT_TIMEOUT_S,
            command_timeout=_COMMAND_TIMEOUT_S)
        async with self._pool.acquire() as db, db.transaction():
            await db.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            await db.execute("CREATE TABLE IF NOT EXISTS schema_migrations "
                             "(version INTEGER PRIMARY KEY, "
                             "applied_at DOUBLE PRECISION NOT NULL)")
            done = {r["version"] for r in await db.fetch("SELECT version FROM schema_migrations")}
            for version, statements in MIGRATIONS:
                if version in done:
                    continue
                for statement in statements:
                    await db.execute(statement)
                await db.execute("INSERT INTO schema_migrations VALUES ($1, $2)",
                                 version, time.time())

    async def write(self, rows: Sequence[LedgerRow]) -> None:
        marks = ", ".join(f"${i}" for i in range(1, len(COLUMNS) + 1))
        async with self._pool.acquire() as db, db.transaction():
            await db.executemany(
                f"INSERT INTO requests ({COLUMN_LIST}) VALUES ({marks}) "
                "ON CONFLICT (id) DO NOTHING", rows)

    async def fetch(self, where: RowFilter) -> list[LedgerRow]:
        clause, args = where_clause(where, lambda i: f"${i}")
        records = await self._pool.fetch(
            f"SELECT {COLUMN_LIST} FROM requests{clause} ORDER BY ts, id", *args)
        return [LedgerRow(*record.values()) for record in records]

    async def purge(self, before_ts: float) -> int:
        status: str = await self._pool.execute("DELETE FROM requests WHERE ts < $1", before_ts)
        return int(status.rsplit(" ", 1)[-1])  # "DELETE <count>"

    async def trim(self, max_rows: int) -> int:
        status: str = await self._pool.execute(TRIM.format(mark="$1"), max_rows - 1)
        return int(status.rsplit(" ", 1)[-1])

    async def spent(self, since: float) -> dict[str, tuple[int, float]]:
        records = await self._pool.fetch(SPENT.format(mark="$1"), since)
        return {r[0]: (int(r[1] or 0), float(r[2] or 0)) for r in records}

    async def run(self, sql: str, args: Sequence[object] = ()) -> list[tuple[object, ...]]:
        records = await self._pool.fetch(_numbered(sql), *args)
        return [tuple(record.values()) for record in records]

    async def run_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        async with self._pool.acquire() as db, db.transaction():
            await db.executemany(_numbered(sql), rows)

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()


def _numbered(sql: str) -> str:
    """`?` placeholders as PostgreSQL's `$1`, `$2`, ..."""
    count = iter(range(1, sql.count("?") + 1))
    return re.sub(r"\?", lambda _: f"${next(count)}", sql)
