"""Requests that fail before they are parsed (an oversized header, a malformed request
line) answered as every other error: OpenAI's JSON shape, and the status that says what
was wrong (431 for headers, 414 for the request line) instead of aiohttp's plain 400.

aiohttp builds these answers in `RequestHandler.handle_error`, below the application:
`GatewayRunner` makes its server create connections with `_Handler`, which overrides it.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, ContentEncodingError, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from router.openai_api import ApiError


def request_line_limit(header_limit: int) -> int:
    """The request line's limit: one byte more than a header's, so that the parser's
    `LineTooLong` (the same error for both) tells which one was too long."""
    return header_limit + 1


def parse_error(exc: BaseException | None, status: int, header_limit: int) -> ApiError:
    if isinstance(exc, LineTooLong):
        if exc.args[1:2] == (request_line_limit(header_limit),):
            return ApiError(414, f"The request line is longer than {header_limit} bytes.",
                            code="uri_too_long")
        return ApiError(431, f"A request header is longer than {header_limit} bytes.",
                        code="request_header_fields_too_large")
    if isinstance(exc, ContentEncodingError):  # a coding the parser cannot decode (br, zstd)
        return ApiError(415, "This Content-Encoding is not supported: send the body as "
                        "identity, gzip or deflate (one coding).", code="unsupported_media_type",
                        headers={"Accept-Encoding": "gzip, deflate, identity"})
    if isinstance(exc, BadHttpMessage) and "many headers" in str(exc):
        return ApiError(431, "The request has too many headers.",
                        code="request_header_fields_too_large")
    if status >= 500:
        return ApiError(500, "The gateway failed to handle the request.", "server_error",
                        code="internal_error")
    return ApiError(400, "Malformed HTTP request.", code="bad_http_request")


class _Handler(RequestHandler):
    header_limit = 16 * 1024

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:  # an answer has begun: aiohttp's own handling
            return super().handle_error(request, status, exc, message)
        if status >= 500:
            self.log_exception("Error handling request", exc_info=exc)
        else:
            self.log_debug("rejected a malformed request: %s", type(exc).__name__)
        response = parse_error(exc, status, self.header_limit).response()
        response.force_close()
        return response


class _Server(web.Server):
    header_limit = 16 * 1024

    def __call__(self) -> RequestHandler:
        handler = _Handler(self, loop=self._loop, **self._kwargs)
        handler.header_limit = self.header_limit
        return handler


class GatewayRunner(web.AppRunner):
    """An `AppRunner` whose connections answer parse errors in OpenAI's shape."""

    def __init__(self, app: web.Application, header_limit: int, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.header_limit = header_limit

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # the same server; only its connections' class differs
        server.header_limit = self.header_limit  # type: ignore[attr-defined]
        return server
