"""OpenAI's Batches API over `router.batch.jobs`: create (the input file checked whole),
retrieve, list and cancel, for the caller's tenant only, in OpenAI's shapes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from router.batch.endpoint import tenant_api, tenant_of
from router.common.errors import ApiError
from router.request.intake import read_body

if TYPE_CHECKING:
    from router.gateway import Gateway
    from router.request.auth import Caller

BODY_BYTES = 64 * 1024  # a create request's body (ids, a window, metadata)


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/batches", tenant_api(_create))
    app.router.add_get("/v1/batches", tenant_api(_list))
    app.router.add_get("/v1/batches/{batch_id}", tenant_api(_retrieve))
    app.router.add_post("/v1/batches/{batch_id}/cancel", tenant_api(_cancel))


async def _create(request: web.Request, gw: Gateway, caller: Caller | None
                  ) -> web.StreamResponse:
    assert gw.jobs is not None
    raw = await read_body(request, BODY_BYTES, gw.config.server.body_read_timeout_s, None)
    try:
        body = orjson.loads(raw)
    except ValueError:
        raise ApiError(400, "The body must be a JSON object.") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The body must be a JSON object.")
    job = await gw.jobs.create(tenant_of(caller), caller.key_id if caller else None, body)
    return web.json_response(job.as_openai())


async def _list(request: web.Request, gw: Gateway, caller: Caller | None
                ) -> web.StreamResponse:
    assert gw.jobs is not None
    try:
        limit = int(request.query.get("limit", 20))
    except ValueError:
        limit = -1
    if not 1 <= limit <= 100:
        raise ApiError(400, "limit: a whole number from 1 to 100.", param="limit")
    jobs, more = await gw.jobs.page(tenant_of(caller), request.query.get("after") or None,
                                    limit)
    data = [job.as_openai() for job in jobs]
    return web.json_response({"object": "list", "data": data,
                              "first_id": data[0]["id"] if data else None,
                              "last_id": data[-1]["id"] if data else None, "has_more": more})


async def _retrieve(request: web.Request, gw: Gateway, caller: Caller | None
                    ) -> web.StreamResponse:
    assert gw.jobs is not None
    job = await gw.jobs.get(tenant_of(caller), request.match_info["batch_id"])
    return web.json_response(job.as_openai())


async def _cancel(request: web.Request, gw: Gateway, caller: Caller | None
                  ) -> web.StreamResponse:
    assert gw.jobs is not None
    job = await gw.jobs.cancel(tenant_of(caller), request.match_info["batch_id"])
    return web.json_response(job.as_openai())
