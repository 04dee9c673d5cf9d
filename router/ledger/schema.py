"""The ledger's portable SQL: the table, its numbered migrations and the shared queries.

Both stores (`router.ledger.sqlite` for SQLite, `router.ledger.postgres`) read these; it
imports neither. Placeholders are spelled by the caller (`?` or `$1`).
"""

from __future__ import annotations

from collections.abc import Callable

from router.ledger.base import COLUMNS, RowFilter

# Portable column types: SQLite reads these as affinities, PostgreSQL as they are.
_TYPES = {
    "id": "TEXT PRIMARY KEY", "ts": "DOUBLE PRECISION NOT NULL", "request_id": "TEXT NOT NULL",
    "endpoint": "TEXT NOT NULL", "stream": "BOOLEAN NOT NULL", "status": "INTEGER NOT NULL",
    "p_simple": "DOUBLE PRECISION", "queue_wait_ms": "DOUBLE PRECISION NOT NULL",
    "ttft_ms": "DOUBLE PRECISION", "total_ms": "DOUBLE PRECISION NOT NULL",
    "slot_ms": "DOUBLE PRECISION NOT NULL", "prompt_tokens": "INTEGER NOT NULL",
    "completion_tokens": "INTEGER NOT NULL", "tokens_estimated": "BOOLEAN NOT NULL",
    "cost": "DOUBLE PRECISION NOT NULL", "counterfactual_cost": "DOUBLE PRECISION NOT NULL",
    "slo_ttft_ms": "DOUBLE PRECISION", "predicted_ttft_ms": "DOUBLE PRECISION",
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
    (3, ("ALTER TABLE requests ADD COLUMN replica TEXT",)),  # rows before it: NULL
    (4, tuple(f"ALTER TABLE requests ADD COLUMN {name} {_TYPES.get(name, 'TEXT')}"
              for name in ("priority", "slo_ttft_ms", "predicted_ttft_ms"))),  # before: NULL
    (5, ("ALTER TABLE requests ADD COLUMN api TEXT",  # the rows before it: from their path
         "UPDATE requests SET api = CASE endpoint WHEN '/v1/chat/completions' THEN 'chat' "
         "WHEN '/v1/completions' THEN 'completions' END")),
    (6, ("ALTER TABLE requests ADD COLUMN usage_rejected BOOLEAN",)),  # before it: NULL
    # Each index is a B-tree every row is written into (SQLite, 300,000 rows: 2.3 us of
    # the writer's CPU per row each, in 100-row INSERTs). Reports and the budgets' seed
    # read a time range; the ts index bounds it, and a filter on experiment or key within
    # it costs a report a scan of that range, not every request its two inserts.
    (7, ("DROP INDEX IF EXISTS requests_experiment_ts",
         "DROP INDEX IF EXISTS requests_key_ts")),
    # The batch jobs' input and output files (router/batch/files.py): who owns each, what
    # it holds; the bytes are in the files directory, named by id.
    (8, ("CREATE TABLE batch_files (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, "
         "filename TEXT NOT NULL, purpose TEXT NOT NULL, bytes BIGINT NOT NULL, "
         "lines INTEGER NOT NULL, created_at DOUBLE PRECISION NOT NULL)",
         "CREATE INDEX batch_files_tenant ON batch_files (tenant, created_at)")),
    # Batch jobs (router/batch/jobs.py) and their lines' states and answers.
    (9, ("CREATE TABLE batches (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, key_id TEXT, "
         "endpoint TEXT NOT NULL, model TEXT NOT NULL, input_file_id TEXT NOT NULL, "
         "completion_window TEXT NOT NULL, status TEXT NOT NULL, "
         "created_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL, "
         "in_progress_at DOUBLE PRECISION, finalizing_at DOUBLE PRECISION, "
         "completed_at DOUBLE PRECISION, failed_at DOUBLE PRECISION, "
         "expired_at DOUBLE PRECISION, cancelling_at DOUBLE PRECISION, "
         "cancelled_at DOUBLE PRECISION, output_file_id TEXT, error_file_id TEXT, "
         "total INTEGER NOT NULL, metadata TEXT)",
         "CREATE INDEX batches_tenant ON batches (tenant, created_at)",
         "CREATE INDEX batches_status ON batches (status)",
         "CREATE TABLE batch_lines (batch_id TEXT NOT NULL, line INTEGER NOT NULL, "
         "custom_id TEXT NOT NULL, body TEXT NOT NULL, state TEXT NOT NULL, "
         "status_code INTEGER, answer TEXT, PRIMARY KEY (batch_id, line))",
         "CREATE INDEX batch_lines_state ON batch_lines (batch_id, state)")),
    # Who runs a batch line, and until when its claim holds unless renewed: several
    # gateways drain one job, and a killed one's lines are taken over once their claims
    # lapse (router/batch/claims.py).
    (10, ("ALTER TABLE batch_lines ADD COLUMN owner TEXT",
          "ALTER TABLE batch_lines ADD COLUMN lease_until DOUBLE PRECISION")),
    # Which requests were batch lines (their cost less the batch discount); before it: NULL.
    (11, ("ALTER TABLE requests ADD COLUMN batch BOOLEAN",)),
    # The judge's verdicts on shadowed downgrades (router/quality/verdicts.py): one row per
    # judged request, never a prompt or an answer.
    (12, ("CREATE TABLE verdicts (id TEXT PRIMARY KEY, ts DOUBLE PRECISION NOT NULL, "
          "request_id TEXT NOT NULL, tenant TEXT, route TEXT NOT NULL, intent TEXT, "
          "language TEXT NOT NULL, p_simple DOUBLE PRECISION, "
          "prompt_tokens INTEGER NOT NULL, small_backend TEXT NOT NULL, "
          "primary_backend TEXT NOT NULL, verdict TEXT, judge_version TEXT NOT NULL, "
          "saved DOUBLE PRECISION NOT NULL)",
          "CREATE INDEX verdicts_ts ON verdicts (ts)")),
    # The texts behind a verdict, kept only with quality.keep_texts (a user's prompt and two
    # answers): apart from the figures, so that reading a report never reads them.
    (13, ("CREATE TABLE verdict_texts (verdict_id TEXT PRIMARY KEY, "
          "ts DOUBLE PRECISION NOT NULL, question TEXT NOT NULL, small_answer TEXT NOT NULL, "
          "primary_answer TEXT NOT NULL)",
          "CREATE INDEX verdict_texts_ts ON verdict_texts (ts)")),
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

