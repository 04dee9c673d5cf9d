"""Anthropic's Message Batches API over `router.batch.jobs`: create (the requests inline,
checked whole by `router.batch.message_check`), retrieve, list, cancel, results and delete,
for the caller's tenant only, in Anthropic's shapes and errors. A Message Batch is a job
of endpoint `/v1/messages`; its results file is the job's output file.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from router.apis.anthropic import ANTHROPIC
from router.batch.endpoint import Handler, TenantHandler, tenant_api, tenant_of
from router.batch.jobs import ENDED, MESSAGES, Job, Jobs
from router.batch.message_check import checked_requests
from router.common.errors import ApiError
from router.request.intake import read_body

if TYPE_CHECKING:
    from router.gateway import Gateway
    from router.request.auth import Caller

PREFIX = "msgbatch_"
WINDOW = "24h"  # Anthropic's: a batch not ended within a day expires
LIST_LIMIT = 1000  # Anthropic's largest page


def setup(app: web.Application) -> None:
    base = "/v1/messages/batches"
    app.router.add_post(base, _api(_create))
    app.router.add_get(base, _api(_list))
    app.router.add_get(base + "/{batch_id}", _api(_retrieve))
    app.router.add_delete(base + "/{batch_id}", _api(_delete))
    app.router.add_post(base + "/{batch_id}/cancel", _api(_cancel))
    app.router.add_get(base + "/{batch_id}/results", _api(_results))


def _api(handler: TenantHandler) -> Handler:
    return tenant_api(handler, ANTHROPIC)


def _stamp(at: float | None) -> str | None:
    """RFC 3339, as Anthropic writes its times."""
    if at is None:
        return None
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="microseconds").replace(
        "+00:00", "Z")


def message_batch(job: Job) -> dict[str, Any]:
    """A job as Anthropic's batch object. Its counts move as lines end (Anthropic's own
    move only when the batch ends); they add up to the batch's requests either way.
    `results_url` is the gateway's path, which the SDKs join to their base URL."""
    counts = job.counts
    ended = job.status in ENDED
    ended_at = next((job.stamps[f"{status}_at"] for status in ENDED
                     if job.stamps.get(f"{status}_at") is not None), None)
    return {
        "id": job.id, "type": "message_batch",
        "processing_status": "ended" if ended else (
            "canceling" if job.status == "cancelling" else "in_progress"),
        "request_counts": {
            "processing": counts.get("waiting", 0) + counts.get("running", 0),
            "succeeded": counts.get("done", 0), "errored": counts.get("failed", 0),
            "canceled": counts.get("cancelled", 0), "expired": counts.get("expired", 0)},
        "ended_at": _stamp(ended_at), "created_at": _stamp(job.created_at),
        "expires_at": _stamp(job.expires_at), "archived_at": None,
        "cancel_initiated_at": _stamp(job.stamps.get("cancelling_at")),
        "results_url": f"/v1/messages/batches/{job.id}/results" if ended else None,
    }


async def _batch(jobs: Jobs, tenant: str, batch_id: str) -> Job:
    """The tenant's Message Batch of that id (an OpenAI job's id is not one)."""
    job = None
    if batch_id.startswith(PREFIX):
        with contextlib.suppress(ApiError):  # (only "not found": told in Anthropic's words)
            job = await jobs.get(tenant, batch_id)
    if job is None or job.endpoint != MESSAGES:
        raise ApiError(404, f"No Message Batch with id {batch_id!r}.", param="batch_id")
    return job


async def _create(request: web.Request, gw: Gateway, caller: Caller | None
                  ) -> web.StreamResponse:
    assert gw.jobs is not None
    config = gw.config.batch
    raw = await read_body(request, config.max_file_bytes, config.upload_timeout_s, None)
    model, lines = await asyncio.to_thread(checked_requests, raw, gw.jobs.routes,
                                           gw.config.server, config)
    job = await gw.jobs.add(PREFIX + os.urandom(12).hex(), tenant_of(caller),
                            caller.key_id if caller else None, MESSAGES, model, "", WINDOW,
                            None, lines)
    return web.json_response(message_batch(job))


async def _list(request: web.Request, gw: Gateway, caller: Caller | None
                ) -> web.StreamResponse:
    assert gw.jobs is not None
    query = request.query
    try:
        limit = int(query.get("limit", 20))
    except ValueError:
        limit = -1
    if not 1 <= limit <= LIST_LIMIT:
        raise ApiError(400, f"limit: a whole number from 1 to {LIST_LIMIT}.", param="limit")
    after, before = query.get("after_id") or None, query.get("before_id") or None
    if after is not None and before is not None:
        raise ApiError(400, "after_id and before_id: give one of them, not both.",
                       param="before_id")
    tenant = tenant_of(caller)
    for mark in (after, before):
        if mark is not None:
            await _batch(gw.jobs, tenant, mark)
    jobs, more = await gw.jobs.page(tenant, after, limit, before=before, messages=True)
    data = [message_batch(job) for job in jobs]
    return web.json_response({"data": data, "has_more": more,
                              "first_id": data[0]["id"] if data else None,
                              "last_id": data[-1]["id"] if data else None})


async def _retrieve(request: web.Request, gw: Gateway, caller: Caller | None
                    ) -> web.StreamResponse:
    assert gw.jobs is not None
    job = await _batch(gw.jobs, tenant_of(caller), request.match_info["batch_id"])
    return web.json_response(message_batch(job))


async def _cancel(request: web.Request, gw: Gateway, caller: Caller | None
                  ) -> web.StreamResponse:
    assert gw.jobs is not None
    job = await _batch(gw.jobs, tenant_of(caller), request.match_info["batch_id"])
    if job.status in ENDED:
        raise ApiError(400, f"The Message Batch {job.id} has ended; it cannot be canceled.")
    if job.status != "cancelling":  # (asked again: the batch as it is)
        job = await gw.jobs.cancel(job.tenant, job.id)
    return web.json_response(message_batch(job))


async def _results(request: web.Request, gw: Gateway, caller: Caller | None
                   ) -> web.StreamResponse:
    assert gw.jobs is not None and gw.files is not None
    job = await _batch(gw.jobs, tenant_of(caller), request.match_info["batch_id"])
    if job.status not in ENDED or job.output_file_id is None:
        raise ApiError(400, f"The Message Batch {job.id} has not ended yet: its results "
                       "come when it has.")
    record = await gw.files.get(job.tenant, job.output_file_id)
    return web.FileResponse(gw.files.path(record), headers={
        "Content-Type": "application/binary",
        "Content-Disposition": f'attachment; filename="{job.id}_results.jsonl"'})


async def _delete(request: web.Request, gw: Gateway, caller: Caller | None
                  ) -> web.StreamResponse:
    assert gw.jobs is not None and gw.files is not None
    job = await _batch(gw.jobs, tenant_of(caller), request.match_info["batch_id"])
    if job.status not in ENDED:
        raise ApiError(400, f"The Message Batch {job.id} is still processing; cancel it "
                       "before deleting it.")
    await gw.jobs.delete(job.tenant, job.id)
    if job.output_file_id is not None:
        with contextlib.suppress(ApiError):  # its results file removed already
            await gw.files.delete(job.tenant, job.output_file_id)
    return web.json_response({"id": job.id, "type": "message_batch_deleted"})
