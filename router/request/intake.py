"""How a request's body comes in: its declared type and coding checked before any of it is
read (415), then its bytes read under the size cap (413) and the read timeout (408),
counted in its `BodyHold`. Parsing what came is `router.openai_api`'s."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from router.common.errors import ApiError, too_large
from router.request.body import BodyHold


def check_content_type(request: web.BaseRequest) -> None:
    """415 unless the body is declared JSON (no Content-Type at all is accepted)."""
    declared = request.headers.get("Content-Type")
    if declared is not None and request.content_type != "application/json":
        raise ApiError(415, f"Content-Type must be application/json, not {declared[:100]!r}.",
                       code="unsupported_media_type")


# Request codings the server's parser inflates itself (aiohttp, a single coding only), the
# size limit then counting the inflated bytes; "identity" is no coding at all.
_DECODED = frozenset({"gzip", "deflate"})


def check_content_encoding(request: web.BaseRequest) -> None:
    """415 for a body coding the gateway does not decode (br, zstd, compress, x-gzip,
    stacked codings...), before any of the body is read. A gzip or deflate body is
    inflated as it is read and forwarded decoded, without Content-Encoding."""
    values = request.headers.getall("Content-Encoding", ())
    if not values:
        return
    codings = [c.strip().lower() for v in values for c in v.split(",")]
    applied = [c for c in codings if c and c != "identity"]
    if not applied or (len(values) == 1 and len(codings) == 1 and codings[0] in _DECODED):
        return
    shown = ", ".join(values)[:100]
    raise ApiError(415, f"Content-Encoding {shown!r} is not supported: send the body as "
                   "identity, gzip or deflate (one coding).", code="unsupported_media_type",
                   headers={"Accept-Encoding": "gzip, deflate, identity"})


async def read_body(request: web.BaseRequest, limit: int, timeout_s: float | None = None,
                    hold: BodyHold | None = None) -> bytes:
    """The request body: 413 before reading past `limit` bytes, 408 if it has not all come
    within `timeout_s`; counted in `hold` (all of a declared length before reading, else
    chunk by chunk as inflated), which may refuse it."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large(limit)
    each = hold
    # A declared length is taken at once, unless the body is compressed: then its inflated
    # bytes are counted as they come (the declared length would undercount them).
    if hold is not None and declared is not None and "Content-Encoding" not in request.headers:
        hold.take(declared)
        each = None
    content = request.content
    if content.is_eof():  # it all came with the headers (the common case): no wait, no timer
        raw = content.read_nowait(-1)
        if len(raw) > limit:
            raise too_large(limit)
        if each is not None:
            each.take(len(raw))
        return raw
    timer: contextlib.nullcontext[None] | asyncio.Timeout = (
        contextlib.nullcontext() if timeout_s is None else asyncio.timeout(timeout_s))
    chunks: list[bytes] = []
    size = 0
    try:
        async with timer:
            while chunk := await content.readany():
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                if each is not None:
                    each.take(len(chunk))
                chunks.append(chunk)
    except TimeoutError:
        _close_when_answered(request)
        raise ApiError(408, f"The request body did not arrive within {timeout_s:g} s.",
                       code="request_timeout", close=True) from None
    return b"".join(chunks)


def _close_when_answered(request: web.BaseRequest) -> None:
    """Close the connection as soon as this request's answer is written.

    aiohttp would otherwise keep reading the unread rest of the body for up to 10 s
    (its lingering close) before closing, and a client that waits for the connection to
    end would get its answer that late. The handler's task ends once aiohttp has written
    the answer; closing the transport then flushes it first. A stalled client has sent
    nothing more, so the close is a FIN, not a reset."""
    transport, task = request.transport, asyncio.current_task()
    if transport is not None and task is not None:
        task.add_done_callback(lambda _: transport.close())
