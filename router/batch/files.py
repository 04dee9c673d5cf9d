"""The batch jobs' files (OpenAI's Files API, purpose `batch`): JSONL a tenant uploads,
kept as bytes in the files directory (named by id) and as a record in the ledger's
database. A tenant sees only its own files; another's is "not found", never "forbidden".

The bytes are written, checked and removed on worker threads, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from policies.config import BatchConfig
from router.common.errors import ApiError
from router.ledger.base import Store

PURPOSES = frozenset({"batch"})  # what a client may upload files for
LIST_LIMIT = 10_000  # OpenAI's largest page of files
_FIELDS = "id, tenant, filename, purpose, bytes, lines, created_at"


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: str
    tenant: str
    filename: str
    purpose: str
    bytes: int
    lines: int  # requests in it
    created_at: float  # Unix seconds

    def as_openai(self) -> dict[str, object]:
        return {"id": self.id, "object": "file", "bytes": self.bytes,
                "created_at": int(self.created_at), "filename": self.filename,
                "purpose": self.purpose, "status": "processed", "expires_at": None,
                "status_details": None}


def _record(row: tuple[object, ...]) -> FileRecord:
    id_, tenant, filename, purpose, size, lines, created = row
    return FileRecord(str(id_), str(tenant), str(filename), str(purpose), int(size),  # type: ignore[call-overload]
                      int(lines), float(created))  # type: ignore[call-overload, arg-type]


def _invalid(message: str, code: str = "invalid_file") -> ApiError:
    return ApiError(400, message, code=code, param="file")


def check_lines(path: Path, config: BatchConfig) -> int:
    """The number of requests in a batch input file; a 400 naming the first bad line."""
    seen: set[str] = set()
    count = 0
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            if len(line) > config.max_line_bytes:
                raise _invalid(f"Line {number} is longer than {config.max_line_bytes} bytes.")
            try:
                request = orjson.loads(line)
            except orjson.JSONDecodeError:
                raise _invalid(f"Line {number} is not valid JSON.") from None
            if not isinstance(request, dict):
                raise _invalid(f"Line {number} is not a JSON object.")
            problem = _line_problem(request, seen)
            if problem:
                raise _invalid(f"Line {number}: {problem}")
            count += 1
            if count > config.max_lines:
                raise _invalid(f"The file holds more than {config.max_lines} requests.")
    if count == 0:
        raise _invalid("The file holds no requests: one JSON object per line is expected.")
    return count


def _line_problem(request: dict[str, object], seen: set[str]) -> str | None:
    custom_id, body = request.get("custom_id"), request.get("body")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
        return "'custom_id' must be a string of 1 to 512 characters."
    if custom_id in seen:
        return f"the custom_id {custom_id!r} is used more than once."
    seen.add(custom_id)
    if request.get("method") != "POST":
        return "'method' must be \"POST\"."
    if not isinstance(request.get("url"), str):
        return "'url' must be a string such as \"/v1/chat/completions\"."
    if not isinstance(body, dict):
        return "'body' must be a JSON object."
    return None


class Files:
    """The files of every tenant: records in `store`, bytes in `directory`."""

    def __init__(self, store: Store, directory: Path, config: BatchConfig) -> None:
        self.store = store
        self.directory = directory
        self.config = config

    def path(self, record: FileRecord) -> Path:
        return self.directory / record.id

    async def receive(self, tenant: str, filename: str, purpose: str,
                      chunks: AsyncIterator[bytes]) -> FileRecord:
        """Keep an upload: written to a temporary name while it arrives (at most
        `max_file_bytes`), checked, then renamed to its id and recorded."""
        file_id = "file-" + os.urandom(12).hex()
        # made at the first upload: a gateway whose clients never batch leaves no folder
        await asyncio.to_thread(self.directory.mkdir, parents=True, exist_ok=True)
        partial = self.directory / f".{file_id}.part"
        try:
            size = await self._write(partial, chunks)
            lines = await asyncio.to_thread(check_lines, partial, self.config)
            await asyncio.to_thread(partial.rename, self.directory / file_id)
        finally:
            await asyncio.to_thread(partial.unlink, missing_ok=True)
        return await self._record(FileRecord(file_id, tenant, filename, purpose, size, lines,
                                             time.time()))

    async def keep(self, tenant: str, filename: str, purpose: str, data: bytes,
                   lines: int) -> FileRecord:
        """A file the gateway made (a batch's output or errors)."""
        file_id = "file-" + os.urandom(12).hex()
        await asyncio.to_thread(_write_whole, self.directory, file_id, data)
        return await self._record(FileRecord(file_id, tenant, filename, purpose, len(data),
                                             lines, time.time()))

    async def _record(self, record: FileRecord) -> FileRecord:
        try:
            await self.store.run(f"INSERT INTO batch_files ({_FIELDS}) VALUES "
                                 "(?, ?, ?, ?, ?, ?, ?)",
                                 (record.id, record.tenant, record.filename, record.purpose,
                                  record.bytes, record.lines, record.created_at))
        except BaseException:
            await asyncio.to_thread(self.path(record).unlink, missing_ok=True)
            raise
        return record

    async def _write(self, partial: Path, chunks: AsyncIterator[bytes]) -> int:
        limit = self.config.max_file_bytes
        size = 0
        out = await asyncio.to_thread(partial.open, "xb")
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"The file is larger than {limit} bytes.",
                                   code="file_too_large", param="file")
                await asyncio.to_thread(out.write, chunk)
        finally:
            await asyncio.to_thread(out.close)
        return size

    async def get(self, tenant: str, file_id: str) -> FileRecord:
        rows = await self.store.run(f"SELECT {_FIELDS} FROM batch_files WHERE id = ? "
                                    "AND tenant = ?", (file_id, tenant))
        if not rows:
            raise ApiError(404, f"No such File object: {file_id}", code="file_not_found",
                           param="file_id")
        return _record(rows[0])

    async def page(self, tenant: str, purpose: str | None, after: str | None, limit: int,
                   newest_first: bool) -> tuple[list[FileRecord], bool]:
        """A page of the tenant's files and whether more follow (`after`: a file id)."""
        where, args = ["tenant = ?"], [tenant]
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        if after is not None:
            mark = await self.get(tenant, after)
            where.append("(created_at, id) < (?, ?)" if newest_first
                         else "(created_at, id) > (?, ?)")
            args += [mark.created_at, mark.id]  # type: ignore[list-item]
        order = "DESC" if newest_first else "ASC"
        rows = await self.store.run(
            f"SELECT {_FIELDS} FROM batch_files WHERE {' AND '.join(where)} "
            f"ORDER BY created_at {order}, id {order} LIMIT {int(limit) + 1}", args)
        return [_record(row) for row in rows[:limit]], len(rows) > limit

    async def delete(self, tenant: str, file_id: str) -> FileRecord:
        record = await self.get(tenant, file_id)
        await self.store.run("DELETE FROM batch_files WHERE id = ? AND tenant = ?",
                             (file_id, tenant))
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(self.path(record).unlink)
        return record


def _write_whole(directory: Path, file_id: str, data: bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{file_id}.part"
    try:
        partial.write_bytes(data)
        partial.rename(directory / file_id)
    finally:
        partial.unlink(missing_ok=True)


def files_dir(config: BatchConfig, ledger_path: str | None) -> Path:
    """Where the files' bytes go: as configured, else beside a SQLite ledger."""
    if config.files_dir is not None:
        return Path(config.files_dir)
    return Path(f"{ledger_path}.files" if ledger_path else "slotgate-files")
