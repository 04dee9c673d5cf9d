"""Batch jobs (OpenAI's Batches API): a job is an input file's requests run later, in the
slots interactive traffic leaves idle (`router.batch.runner`). A job and each of its
lines' states and answers live in the ledger's database, so a gateway that stops loses
nothing: what ran to its end is kept, what was running runs again. A tenant sees only its
own jobs.

Job states, as OpenAI names them: validating -> in_progress -> finalizing -> completed;
in_progress -> cancelling -> cancelled; in_progress -> expired (past its window). Anthropic's
Message Batches are jobs too (endpoint `/v1/messages`, ids `msgbatch_...`), shown in their
own API's shape by `router.batch.message_batches_api`.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from policies.config import ServerConfig
from router.batch.check import ENDPOINTS, checked_lines
from router.batch.files import Files
from router.common.errors import ApiError
from router.ledger.base import Store

WINDOWS = {"24h": 86_400.0}  # the completion windows OpenAI offers
_STAMPS = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
           "cancelling_at", "cancelled_at")
_FIELDS = ("id, tenant, key_id, endpoint, model, input_file_id, completion_window, status, "
           "created_at, expires_at, " + ", ".join(_STAMPS) + ", output_file_id, "
           "error_file_id, total, metadata")
_MARKS = ", ".join("?" * (_FIELDS.count(",") + 1))
ACTIVE = ("validating", "in_progress", "cancelling", "finalizing")
ENDED = ("completed", "failed", "expired", "cancelled")
MESSAGES = "/v1/messages"  # the endpoint of Anthropic's Message Batches
UNRUN = ("cancelled", "expired")  # the states of lines that never ran: their job ended first


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    tenant: str
    key_id: str | None
    endpoint: str
    model: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: float
    expires_at: float
    stamps: dict[str, float | None]
    output_file_id: str | None
    error_file_id: str | None
    total: int
    metadata: dict[str, str] | None
    counts: dict[str, int] = field(default_factory=dict)  # lines by state

    def as_openai(self) -> dict[str, Any]:
        done = self.counts.get("done", 0)
        # lines that never ran are in the error file too: the counts add up to the total
        failed = sum(self.counts.get(state, 0) for state in ("failed", *UNRUN))
        return {
            "id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": None,
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status, "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id, "created_at": int(self.created_at),
            "expires_at": int(self.expires_at), "metadata": self.metadata, "model": self.model,
            **{name: None if at is None else int(at) for name, at in self.stamps.items()},
            "request_counts": {"total": self.total, "completed": done, "failed": failed},
        }


def _job(row: tuple[Any, ...], counts: dict[str, int]) -> Job:
    (id_, tenant, key_id, endpoint, model, input_file_id, window, status, created,
     expires, *rest) = row
    stamps = dict(zip(_STAMPS, rest[:len(_STAMPS)], strict=True))
    output, error, total, metadata = rest[len(_STAMPS):]
    return Job(id_, tenant, key_id, endpoint, model, input_file_id, window, status,
               float(created), float(expires), stamps, output, error, int(total),
               orjson.loads(metadata) if metadata else None, counts)


def _metadata(value: object) -> dict[str, str] | None:
    """OpenAI's bounds: at most 16 pairs, keys to 64 characters, values to 512."""
    if value is None:
        return None
    if (not isinstance(value, dict) or len(value) > 16
            or not all(isinstance(k, str) and isinstance(v, str) and len(k) <= 64
                       and len(v) <= 512 for k, v in value.items())):
        raise ApiError(400, "metadata: at most 16 string pairs, keys up to 64 characters "
                       "and values up to 512.", param="metadata")
    return value


class Jobs:
    """Every tenant's batch jobs, in `store`; their files through `files`."""

    def __init__(self, store: Store, files: Files, routes: frozenset[str],
                 server: ServerConfig) -> None:
        self.store = store
        self.files = files
        self.routes = routes
        self.server = server
        self.changed = asyncio.Event()  # a job was created or cancelled: the runner looks

    async def create(self, tenant: str, key_id: str | None, body: dict[str, Any]) -> Job:
        url, window = body.get("endpoint"), body.get("completion_window")
        if url not in ENDPOINTS:
            raise ApiError(400, f"endpoint: one of {', '.join(ENDPOINTS)}.", param="endpoint")
        if window not in WINDOWS:
            raise ApiError(400, "completion_window: '24h'.", param="completion_window")
        metadata = _metadata(body.get("metadata"))
        file_id = body.get("input_file_id")
        if not isinstance(file_id, str):
            raise ApiError(400, "input_file_id: the id of an uploaded file.",
                           param="input_file_id")
        record = await self.files.get(tenant, file_id)
        model, lines = await asyncio.to_thread(checked_lines, self.files.path(record), url,
                                               self.routes, self.server)
        return await self.add("batch_" + os.urandom(12).hex(), tenant, key_id, url, model,
                              file_id, window, metadata, lines)

    async def add(self, job_id: str, tenant: str, key_id: str | None, url: str, model: str,
                  file_id: str, window: str, metadata: dict[str, str] | None,
                  lines: list[tuple[int, str, bytes]]) -> Job:
        """A job of checked lines ((number, custom_id, body)), in progress at once."""
        now = time.time()
        await self.store.run_many(
            "INSERT INTO batch_lines (batch_id, line, custom_id, body, state) "
            "VALUES (?, ?, ?, ?, 'waiting')",
            [(job_id, number, custom_id, raw.decode()) for number, custom_id, raw in lines])
        await self.store.run(
            f"INSERT INTO batches ({_FIELDS}) VALUES ({_MARKS})",
            (job_id, tenant, key_id, url, model, file_id, window, "in_progress", now,
             now + WINDOWS[window], now, *([None] * 6), None, None, len(lines),
             orjson.dumps(metadata).decode() if metadata is not None else None))
        self.changed.set()
        return await self.get(tenant, job_id)

    async def get(self, tenant: str | None, job_id: str) -> Job:
        """`tenant` None: any tenant's (the runner's)."""
        where, args = "id = ?", [job_id]
        if tenant is not None:
            where, args = where + " AND tenant = ?", [*args, tenant]
        rows = await self.store.run(f"SELECT {_FIELDS} FROM batches WHERE {where}", args)
        if not rows:
            raise ApiError(404, f"No such Batch object: {job_id}", code="batch_not_found",
                           param="batch_id")
        return _job(rows[0], await self.counts(job_id))

    async def counts(self, job_id: str) -> dict[str, int]:
        rows = await self.store.run("SELECT state, COUNT(*) FROM batch_lines WHERE "
                                    "batch_id = ? GROUP BY state", (job_id,))
        return {str(state): int(n) for state, n in rows}  # type: ignore[call-overload]

    async def page(self, tenant: str, after: str | None, limit: int, *,
                   before: str | None = None, messages: bool = False
                   ) -> tuple[list[Job], bool]:
        """Newest first, as both APIs list batches, and whether more follow that way;
        `after`: older than this batch id, `before`: newer (the page nearest it). OpenAI's
        jobs, or Anthropic's Message Batches (`messages`)."""
        where, args = "tenant = ? AND endpoint " + ("=" if messages else "<>") + " ?", [
            tenant, MESSAGES]
        newer = before is not None
        mark_id = before if newer else after
        if mark_id is not None:
            mark = await self.get(tenant, mark_id)
            where += " AND (created_at, id) " + (">" if newer else "<") + " (?, ?)"
            args += [mark.created_at, mark.id]  # type: ignore[list-item]
        order = "ASC" if newer else "DESC"
        rows = await self.store.run(f"SELECT {_FIELDS} FROM batches WHERE {where} ORDER BY "
                                    f"created_at {order}, id {order} LIMIT {int(limit) + 1}",
                                    args)
        jobs = [_job(row, await self.counts(str(row[0]))) for row in rows[:limit]]
        return (jobs[::-1] if newer else jobs), len(rows) > limit

    async def cancel(self, tenant: str, job_id: str) -> Job:
        job = await self.get(tenant, job_id)
        if job.status not in ("validating", "in_progress"):
            raise ApiError(409, f"A batch that is {job.status} cannot be cancelled.",
                           code="batch_not_cancellable")
        await self.store.run("UPDATE batches SET status = 'cancelling', cancelling_at = ? "
                             "WHERE id = ? AND status IN ('validating', 'in_progress')",
                             (time.time(), job_id))
        self.changed.set()
        return await self.get(tenant, job_id)

    async def delete(self, tenant: str, job_id: str) -> Job:
        """An ended job and its lines (its files are the caller's to remove)."""
        job = await self.get(tenant, job_id)
        if job.status not in ENDED:
            raise ApiError(409, f"A batch that is {job.status} cannot be deleted; cancel it "
                           "first.", code="batch_not_deletable")
        await self.store.run("DELETE FROM batch_lines WHERE batch_id = ?", (job_id,))
        await self.store.run("DELETE FROM batches WHERE id = ? AND tenant = ?",
                             (job_id, tenant))
        return job
