"""The usage and cost ledger: one row per request, written in batches off the hot path.

`Ledger.add` is a list append; a background task hands batches to a `Store`
(SQLite by default, PostgreSQL for several replicas). Rows are keyed by a
gateway-made id and inserted with "on conflict do nothing", so writing a batch
twice (a retry after a failed commit or a crash) never duplicates a row.
Nothing here holds prompt or completion text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

log = logging.getLogger("slotgate.ledger")


class LedgerRow(NamedTuple):
    """One request, as the ledger keeps it. Times are in ms, `ts` in Unix seconds. A tuple
    in the table's column order: a store writes it as it is (built once per request, by
    one call, then never copied field by field)."""

    id: str  # made by the gateway, unique per request: the idempotency key
    ts: float  # when the request arrived
    request_id: str  # the x-request-id the client saw (its own, when it sent one)
    endpoint: str  # the path: /v1/chat/completions or /v1/completions
    route: str | None  # the model name the client asked for
    primary: str | None  # that route's primary backend
    experiment: str | None
    arm: str | None
    tenant: str | None  # the key's tenant (auth on), else a hash prefix of the key
    backend: str | None  # the backend that served it (or would have)
    reason: str | None  # primary | fallback:overflow | fallback:simple:<intent>:<p>
    intent: str | None
    p_simple: float | None
    stream: bool
    status: int  # HTTP status; 499 when the client left first
    error: str | None  # the error code, e.g. queue_full, queue_timeout, upstream_timeout
    disconnect: str | None  # where the client left: queued | before_first_byte | streaming
    queue_wait_ms: float
    ttft_ms: float | None
    total_ms: float
    slot_ms: float  # how long it held a slot
    prompt_tokens: int
    completion_tokens: int
    tokens_estimated: bool  # the backend gave no usage: counted or estimated by the gateway
    cost: float  # in the config's currency
    counterfactual_cost: float  # the same request on the route's primary (estimated)
    key_id: str | None = None  # the configured API key's id (auth on); budgets are kept by it
    # The engine of the backend's group that served it (`endpoint` above is the API path);
    # None when it reached no engine, or in rows written before the ledger kept it.
    replica: str | None = None
    # The caller's class, its TTFT objective and the TTFT forecast at its admission (ms);
    # None in rows written before the ledger kept them (and the latter two for requests
    # refused before their route was known, or never admitted).
    priority: str | None = None
    slo_ttft_ms: float | None = None
    predicted_ttft_ms: float | None = None
    # The client API (chat, completions, embeddings, ...); rows written before the ledger
    # kept it have it from their endpoint (migration 5), or None for another endpoint.
    api: str | None = None
    # The engine reported token counts out of bounds (negative, or far beyond the prompt and
    # max_tokens): the gateway's estimate stands in (`tokens_estimated`). None in rows
    # written before the ledger kept it.
    usage_rejected: bool | None = False
    # A batch line (router/batch), priced less its backend's `batch_discount`. None in rows
    # written before the ledger kept it.
    batch: bool | None = False


COLUMNS: tuple[str, ...] = LedgerRow._fields


@dataclass(frozen=True, slots=True)
class RowFilter:
    since: float | None = None  # Unix seconds, inclusive
    until: float | None = None  # Unix seconds, exclusive
    experiment: str | None = None
    route: str | None = None


class Store(Protocol):
    """Where rows go. `write` must be idempotent on `LedgerRow.id`."""

    name: str

    async def open(self) -> None:
        """Connect, create or migrate the schema."""

    async def write(self, rows: Sequence[LedgerRow]) -> None: ...

    async def fetch(self, where: RowFilter) -> list[LedgerRow]: ...

    async def purge(self, before_ts: float) -> int:
        """Delete rows older than `before_ts`; returns how many."""
        ...

    async def trim(self, max_rows: int) -> int:
        """Delete the oldest rows (by `ts`) beyond the newest `max_rows`; returns how many.
        Rows sharing the cut's timestamp are kept, so a few more may remain."""
        ...

    async def spent(self, since: float) -> dict[str, tuple[int, float]]:
        """Per key id: the tokens and cost of its requests since `since` (Unix seconds)."""
        ...

    async def run(self, sql: str, args: Sequence[object] = ()) -> list[tuple[object, ...]]:
        """One statement of the other tables in the ledger's database (the batch jobs'),
        `?` for each argument, in a transaction of its own; the rows it returns."""
        ...

    async def run_many(self, sql: str, rows: Sequence[Sequence[object]]) -> None:
        """One statement for each of `rows`, all in one transaction."""
        ...

    async def close(self) -> None: ...


class Ledger:
    """Buffers rows and writes them in batches; `close` writes every row still held.

    The buffer is bounded: while the store is unreachable rows are kept up to
    `max_pending`, then the oldest are dropped and counted (never the event loop blocked).
    The table is bounded by age (`retention_s`) and by size (`max_rows`): both are
    enforced at start and then hourly, so between two purges it may hold up to an hour's
    rows beyond `max_rows`.
    """

    def __init__(self, store: Store, batch_rows: int = 500, flush_interval_s: float = 0.5,
                 max_pending: int = 100_000, retention_s: float | None = None,
                 max_rows: int | None = None) -> None:
        self.store = store
        self.max_rows = max_rows
        self.batch_rows = batch_rows
        self.flush_interval_s = flush_interval_s
        self.max_pending = max_pending
        self.retention_s = retention_s
        self.written = 0
        self.dropped = 0
        self.failures = 0
        self._pending: list[LedgerRow] = []
        self._wake = asyncio.Event()
        self._writing = asyncio.Lock()  # one batch in flight: a batch is removed once written
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    async def start(self) -> None:
        await self.store.open()
        await self._purge()
        self._task = asyncio.create_task(self._run(), name="ledger-writer")

    def add(self, row: LedgerRow) -> None:
        pending = self._pending
        pending.append(row)
        if len(pending) > self.max_pending:
            del pending[0]
            self.dropped += 1
        if len(pending) >= self.batch_rows:
            self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def flush(self) -> None:
        """Write the rows added so far, in batches (raises if the store fails). Not those
        added while it writes: chasing them, a busy gateway's writer wrote whatever came
        during its last write, batches of a few rows back to back, and the writer thread
        took the GIL from the event loop all the time (the ledger then cost 12% of the
        gateway's CPU at c=64; its rows now wait for the next wake, in full batches)."""
        async with self._writing:
            owed = len(self._pending)
            while owed > 0 and self._pending:
                batch = self._pending[: min(self.batch_rows, owed)]
                await self.store.write(batch)
                self._remove(batch)
                self.written += len(batch)
                owed -= len(batch)

    def _remove(self, batch: list[LedgerRow]) -> None:
        # Rows dropped for space while the batch was written are no longer at the front.
        pending = self._pending
        start = next((i for i, row in enumerate(pending) if row is batch[-1]), None)
        if start is not None:
            del pending[: start + 1]

    async def close(self) -> None:
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})  # raises only a cancellation of close's own
            if not self._task.cancelled() and (failed := self._task.exception()) is not None:
                raise failed
        try:
            while self._pending:  # (with the rows added while it wrote)
                await self.flush()
        except Exception:  # any store's driver error: say how many rows are lost, then close
            log.exception("ledger: %d rows could not be written at shutdown", self.pending)
        finally:
            await self.store.close()

    async def _run(self) -> None:
        purged_at = time.monotonic()
        backoff = self.flush_interval_s
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(backoff):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush()
            except Exception as exc:  # the store is down: keep the rows, try again later
                self.failures += 1
                backoff = min(30.0, backoff * 2)
                log.warning("ledger: write to %s failed (%s: %s); %d rows held, retry in %.1f s",
                            self.store.name, type(exc).__name__, exc, self.pending, backoff)
                continue
            backoff = self.flush_interval_s
            if time.monotonic() - purged_at > 3600:
                purged_at = time.monotonic()
                await self._purge()

    async def _purge(self) -> None:
        try:
            if self.retention_s is not None:
                removed = await self.store.purge(time.time() - self.retention_s)
                if removed:
                    log.info("ledger: removed %d rows older than the retention period",
                             removed)
            if self.max_rows is not None:
                removed = await self.store.trim(self.max_rows)
                if removed:
                    log.info("ledger: removed the %d oldest rows beyond max_rows (%d)",
                             removed, self.max_rows)
        except Exception as exc:  # any store's driver error: purging waits for the next hour
            log.warning("ledger: purge failed (%s: %s)", type(exc).__name__, exc)
