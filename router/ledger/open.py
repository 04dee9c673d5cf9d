"""Opening the ledger: the configured store (SQLite path or postgresql:// URL) behind a
`Ledger`. Above both stores, so neither imports the other.
"""

from __future__ import annotations

from policies.config import LedgerConfig
from router.common.config_error import from_env
from router.ledger.base import Ledger, Store
from router.ledger.sqlite import SQLiteStore


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
        from router.ledger.postgres import PostgresStore

        return PostgresStore(target)
    return SQLiteStore(target)
