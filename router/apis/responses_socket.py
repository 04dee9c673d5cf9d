"""`GET /v1/responses`: the Responses API's WebSocket mode, declined so that a client
falls back to HTTP at once.

Codex opens a WebSocket on `GET /v1/responses` (`OpenAI-Beta: responses_websockets=...`)
and sends `response.create` frames; its later turns send only the new items, with
`previous_response_id` naming the response before, which the server is to remember for
the socket's life. The gateway keeps no responses (docs/responses-api.md), so it does not
upgrade: it answers `426 Upgrade Required`, the one status on which Codex gives up the
WebSocket at once and for the rest of its session, using `POST /v1/responses` (SSE)
instead. Any other status is retried as a failed connection first (seven attempts, about
6 s). A GET without an upgrade gets 405 (Allow: POST). Either way the attempt has its
line in the access log; no slot is taken, no ledger row written.
"""

from __future__ import annotations

import logging
import time

import orjson
from aiohttp import web

from policies.apis import Api
from router.common.errors import ApiError
from router.common.parsed import Endpoint
from router.common.record import RequestRecord, key_id, new_id, request_id
from router.gateway import GATEWAY
from router.request.access_log import log_refused

log = logging.getLogger("slotgate.access")


async def responses_socket(request: web.Request) -> web.StreamResponse:
    """A WebSocket attempt (or a plain GET) on /v1/responses: 426 (or 405), logged."""
    gw = request.app[GATEWAY]
    own = new_id()
    rec = RequestRecord(request_id(request, own), Endpoint.RESPONSES.value,
                        time.perf_counter(), time.time(), own, Api.RESPONSES.value,
                        tenant=None if gw.keyring.enabled else key_id(request))
    try:
        caller = gw.keyring.caller(request)  # a wrong key is told so first: 401
        if caller is not None:
            rec.tenant, rec.key_id = caller.tenant, caller.key_id
        err = _declined(request)
    except ApiError as refused:
        gw.metrics.auth_failures.add((refused.code or "",))
        err = refused
    rec.status, rec.error = err.status, err.code
    err.headers["x-request-id"] = rec.request_id
    rec.total_ms = (time.perf_counter() - rec.started_at) * 1000
    logs = gw.config.logging
    if logs.access and log.isEnabledFor(logging.INFO):
        if gw.keyring.enabled and rec.key_id is None:
            log_refused(log, gw.refusals, rec, logs.refusal_interval_s)
        else:
            log.info(orjson.dumps(rec).decode())
    return err.response()


def _declined(request: web.Request) -> ApiError:
    if "websocket" not in request.headers.get("Upgrade", "").lower():
        return ApiError(405, "Method Not Allowed: GET /v1/responses (POST a request).",
                        code="method_not_allowed", headers={"Allow": "POST"})
    return ApiError(426, "The Responses API's WebSocket mode is not served by this "
                    "gateway: POST /v1/responses (with \"stream\": true for events).",
                    code="websocket_not_supported")
