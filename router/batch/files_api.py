"""OpenAI's Files API over `router.batch.files`: upload (multipart, streamed to disk),
retrieve, list, content and delete, each for the caller's tenant only, each refusal in
OpenAI's error shape. The routes are added by `setup`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import BodyPartReader, MultipartReader, web

from router.batch.endpoint import Handler, tenant_api, tenant_of
from router.batch.files import LIST_LIMIT, PURPOSES, FileRecord, Files
from router.common.errors import ApiError

if TYPE_CHECKING:
    from router.gateway import Gateway
    from router.request.auth import Caller

CHUNK = 256 * 1024  # read from the upload at a time
FIELD_BYTES = 1024  # the most a form field other than the file may hold


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/files", _api(_upload))
    app.router.add_get("/v1/files", _api(_list))
    app.router.add_get("/v1/files/{file_id}", _api(_retrieve))
    app.router.add_delete("/v1/files/{file_id}", _api(_delete))
    app.router.add_get("/v1/files/{file_id}/content", _api(_content))


def _api(handler: Callable[[web.Request, Files, str], Awaitable[web.StreamResponse]]
         ) -> Handler:
    async def handle(request: web.Request, gw: Gateway, caller: Caller | None
                     ) -> web.StreamResponse:
        assert gw.files is not None  # (tenant_api answers 404 without)
        return await handler(request, gw.files, tenant_of(caller))

    return tenant_api(handle)


async def _upload(request: web.Request, files: Files, tenant: str) -> web.StreamResponse:
    if not request.content_type.startswith("multipart/"):
        raise ApiError(400, "Upload a file as multipart/form-data with the fields 'file' "
                       "and 'purpose'.", code="invalid_content_type")
    reader = await request.multipart()
    purpose: str | None = None
    record: FileRecord | None = None
    try:
        async with asyncio.timeout(files.config.upload_timeout_s):
            while (part := await reader.next()) is not None:
                if isinstance(part, MultipartReader):
                    raise ApiError(400, "Nested multipart bodies are not accepted.",
                                   code="invalid_multipart")
                if part.name == "purpose":
                    purpose = await _field(part)
                    _check_purpose(purpose)
                elif part.name == "file" and record is None:
                    # The SDKs send 'purpose' first; one sent after is checked below.
                    record = await files.receive(tenant, _filename(part), purpose or "batch",
                                                 _chunks(part))
                else:
                    await _field(part)
        if record is None:
            raise ApiError(400, "The field 'file' is missing.", code="missing_file",
                           param="file")
        if purpose is None:
            raise ApiError(400, "The field 'purpose' is missing.", code="missing_purpose",
                           param="purpose")
    except TimeoutError:
        await _forget(files, record)
        raise ApiError(408, f"The upload took longer than {files.config.upload_timeout_s:g} "
                       "s.", code="upload_timeout", close=True) from None
    except BaseException:
        await _forget(files, record)
        raise
    return web.json_response(record.as_openai())


async def _forget(files: Files, record: FileRecord | None) -> None:
    """An upload refused after its file was kept: the file goes too."""
    if record is not None:
        await asyncio.shield(files.delete(record.tenant, record.id))


def _check_purpose(purpose: str) -> None:
    if purpose not in PURPOSES:
        raise ApiError(400, f"purpose: {purpose[:64]!r} is not supported here; "
                       "files are kept for 'batch'.", code="invalid_purpose",
                       param="purpose")


def _filename(part: BodyPartReader) -> str:
    name = part.filename or "upload.jsonl"
    return name.replace("\\", "/").rsplit("/", 1)[-1][:255] or "upload.jsonl"


async def _chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    while chunk := await part.read_chunk(CHUNK):
        yield chunk


async def _field(part: BodyPartReader) -> str:
    """A form field other than the file: at most FIELD_BYTES."""
    value = bytearray()
    while chunk := await part.read_chunk(CHUNK):
        value += chunk
        if len(value) > FIELD_BYTES:
            raise ApiError(400, f"The form field {part.name!r} is too large.",
                           code="invalid_multipart")
    return value.decode(errors="replace")


async def _list(request: web.Request, files: Files, tenant: str) -> web.StreamResponse:
    query = request.query
    purpose = query.get("purpose") or None
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, "order: 'asc' or 'desc'.", param="order")
    try:
        limit = int(query.get("limit", LIST_LIMIT))
    except ValueError:
        limit = -1
    if not 1 <= limit <= LIST_LIMIT:
        raise ApiError(400, f"limit: a whole number from 1 to {LIST_LIMIT}.", param="limit")
    records, more = await files.page(tenant, purpose, query.get("after") or None, limit,
                                     newest_first=order == "desc")
    data = [r.as_openai() for r in records]
    return web.json_response({"object": "list", "data": data,
                              "first_id": data[0]["id"] if data else None,
                              "last_id": data[-1]["id"] if data else None,
                              "has_more": more})


async def _retrieve(request: web.Request, files: Files, tenant: str) -> web.StreamResponse:
    record = await files.get(tenant, request.match_info["file_id"])
    return web.json_response(record.as_openai())


async def _delete(request: web.Request, files: Files, tenant: str) -> web.StreamResponse:
    record = await files.delete(tenant, request.match_info["file_id"])
    return web.json_response({"id": record.id, "object": "file", "deleted": True})


async def _content(request: web.Request, files: Files, tenant: str) -> web.StreamResponse:
    record = await files.get(tenant, request.match_info["file_id"])
    return web.FileResponse(files.path(record), headers={
        "Content-Type": "application/jsonl",
        "Content-Disposition": f'attachment; filename="{record.id}.jsonl"'})
