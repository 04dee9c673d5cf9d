"""A Message Batch's requests checked at its creation, as the live `/v1/messages` endpoint
checks each one: a `custom_id` of 1-64 letters, digits, `_` or `-`, unique in the batch;
`params` a Messages request within the bounds of a batch line and of a request body, with
no `stream`, that the endpoint's own parser takes, of a model the gateway routes; and one
model for the whole batch (its lines run on that model's primary). The first bad request
is named in a 400. No I/O: it runs on a worker thread.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from policies.config import BatchConfig, ServerConfig
from router.apis.anthropic import ANTHROPIC
from router.common.errors import ApiError
from router.common.parsed import Endpoint

CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")

Line = tuple[int, str, bytes]  # (number from 1, custom_id, the Messages request's body)


def _bad(message: str, param: str = "requests") -> ApiError:
    return ApiError(400, message, code="invalid_batch_input", param=param)


def checked_requests(raw: bytes, routes: frozenset[str], server: ServerConfig,
                     config: BatchConfig) -> tuple[str, list[Line]]:
    """(the batch's model, its lines) of a create request's body."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise _bad(f"The body is not valid JSON: {exc}", "body") from None
    requests = body.get("requests") if isinstance(body, dict) else None
    if not isinstance(requests, list) or not requests:
        raise _bad("requests: a list of one or more {\"custom_id\", \"params\"} objects.")
    if len(requests) > config.max_lines:
        raise _bad(f"requests: at most {config.max_lines} in one batch.")
    bound = min(config.max_line_bytes, server.max_body_bytes)
    model: str | None = None
    seen: set[str] = set()
    lines: list[Line] = []
    for index, request in enumerate(requests):
        custom_id, params = _entry(index, request, seen)
        where = f"requests[{index}].params"
        params_raw = orjson.dumps(params)
        if len(params_raw) > bound:
            raise _bad(f"{where}: larger than {bound} bytes.", where)
        if params.get("stream"):
            raise _bad(f"{where}.stream: streaming is not available in a batch.",
                       f"{where}.stream")
        try:
            parsed = ANTHROPIC.parse(params_raw, Endpoint.MESSAGES, server)
        except ApiError as err:
            raise _bad(f"{where}: {err.message}", where) from None
        if parsed.model not in routes:
            raise _bad(f"{where}.model: the model {parsed.model!r} does not exist.",
                       f"{where}.model")
        if model is None:
            model = parsed.model
        elif parsed.model != model:
            raise _bad(f"{where}.model: {parsed.model!r} differs from requests[0]'s "
                       f"{model!r}; on this gateway a batch's requests share one model.",
                       f"{where}.model")
        lines.append((index + 1, custom_id, params_raw))
    assert model is not None  # (one request at least)
    return model, lines


def _entry(index: int, request: Any, seen: set[str]) -> tuple[str, dict[str, Any]]:
    """(custom_id, params) of one request, its custom_id unique so far."""
    where = f"requests[{index}]"
    if not isinstance(request, dict):
        raise _bad(f"{where}: an object with 'custom_id' and 'params'.", where)
    custom_id, params = request.get("custom_id"), request.get("params")
    if not isinstance(custom_id, str) or CUSTOM_ID.fullmatch(custom_id) is None:
        raise _bad(f"{where}.custom_id: 1 to 64 letters, digits, '_' or '-'.",
                   f"{where}.custom_id")
    if custom_id in seen:
        raise _bad(f"{where}.custom_id: {custom_id!r} is used more than once; each "
                   "request's custom_id must be unique in the batch.", f"{where}.custom_id")
    seen.add(custom_id)
    if not isinstance(params, dict):
        raise _bad(f"{where}.params: a Messages request object.", f"{where}.params")
    return custom_id, params
