"""Requests that fail before they are parsed (an oversized header, a malformed request
line) answered as every other error: OpenAI's JSON shape, and the status that says what
was wrong (431 for headers, 414 for the request line) instead of aiohttp's plain 400.

aiohttp builds these answers in `RequestHandler.handle_error`, below the application:
`GatewayRunner` makes its server create connections with `_Handler`, which overrides it.
`_Handler` also applies the connection limits of `router.server.connections` (caps, head deadline
and size) and refuses HTTP/0.9 request lines.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, cast

from aiohttp import web
from aiohttp.http import HttpVersion10, HttpVersion11, RawRequestMessage
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadHttpMethod,
    ContentEncodingError,
    LineTooLong,
)
from aiohttp.streams import EMPTY_PAYLOAD, StreamReader
from aiohttp.web_protocol import RequestHandler, _ErrInfo
from aiohttp.web_request import BaseRequest

from policies.config import ServerConfig
from router.common.errors import ApiError, too_large
from router.common.record import new_id
from router.gateway import GATEWAY
from router.request.auth import AUTH_FAILURES
from router.request.intake import check_content_encoding, check_content_type
from router.server.app_handler import app_handler
from router.server.connections import ConnectionGuard, fd_budget
from router.server.no_route import log_unrouted

# An HTTP/1.x request line, but for its method (quoted in the parser's error): 501, not 400.
_REQUEST_LINE = re.compile(r"b'[!#$%&'*+.^_`|~0-9A-Za-z-]+ [!-~]+ HTTP/1\.[01]'")


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
    if isinstance(exc, BadHttpMethod) and _REQUEST_LINE.search(str(exc)):  # else garbage
        return ApiError(501, "The request's method is not implemented by this server.",
                        "server_error", code="method_not_implemented")
    if isinstance(exc, BadHttpMessage) and "many headers" in str(exc):
        return ApiError(431, "The request has too many headers.",
                        code="request_header_fields_too_large")
    if status >= 500:
        return ApiError(500, "The gateway failed to handle the request.", "server_error",
                        code="internal_error")
    return ApiError(400, "Malformed HTTP request.", code="bad_http_request")


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """`Expect: 100-continue` answered with `100 Continue` only once the checks that need
    no body pass (key, declared size, Content-Type and -Encoding); otherwise with their
    error, so that a client never sends a body the gateway refuses anyway. A refused key is
    counted in slotgate_auth_failures_total like any other."""
    if request.version < HttpVersion11:  # HTTP/1.0 knows no 100: nothing to send
        return None
    expect = request.headers.get("Expect", "")
    try:
        if expect.lower() != "100-continue":
            raise ApiError(417, f"Unsupported Expect header: {expect[:100]!r}.",
                           code="expectation_failed")
        gw = request.app[GATEWAY]
        gw.keyring.caller(request)  # 401 for a wrong key
        declared = request.content_length
        if declared is not None and declared > gw.config.server.max_body_bytes:
            raise too_large(gw.config.server.max_body_bytes)
        check_content_type(request)
        check_content_encoding(request)
    except ApiError as error:
        if error.code in AUTH_FAILURES:
            request.app[GATEWAY].metrics.auth_failures.add((error.code or "",))
        response = error.response()
        response.force_close()
        request.content.feed_eof()  # the body held back is not awaited: no lingering read
        return response
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the answer itself has not begun
    return None


class _Handler(RequestHandler):
    __slots__ = ("_body", "_client", "_guard", "_head_bytes", "_http11")

    def __init__(self, manager: _Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = manager.guard
        self._client: str | None = None  # the address its cap counts against, once admitted
        # bytes of the request head being received; -1 while a request's body is awaited
        self._head_bytes = 0
        self._body: StreamReader | None = None  # the body of the last request parsed
        self._http11 = False  # the last request parsed was HTTP/1.1: a 1xx may be sent

    @property
    def header_limit(self) -> int:
        return self._guard.header_limit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) else ""
        refusal = self._guard.admit(client)
        if refusal is not None:  # never handed to aiohttp: connection_lost does nothing
            self._manager = None
            self._force_close = True
            writable = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
            writable.write(refusal)
            writable.close()
            return
        self._client = client
        super().connection_made(transport)
        self._guard.head_started(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._client is not None:
            self._guard.release(self._client)
            self._guard.head_done(self)
            self._guard.probe_done(self)
            self._client = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._force_close:  # closing, or refused: what the client still sends is dropped
            return
        if not data:  # aiohttp resuming its parser once a body was read: no byte from the
            self._parse(data)  # client, so no head began (its deadline must not start)
            return
        if self._head_bytes < 0:  # after a head: a body, then the next request's head
            body = self._body
            if body is not None and not body.is_eof():
                self._parse(data)  # and any pipelined heads after the body's end
                return
            self._head_bytes = 0
            self._guard.head_started(self)
        room = self._guard.max_head_bytes - self._head_bytes
        if len(data) > room:  # the parser gets no more than the head may hold, then...
            self.data_received(data[:room])  # copies: only on this rare path
            if self._head_bytes < 0 and not self._force_close:  # ...the rest if it ended
                self.data_received(data[room:])
            elif not self._force_close:
                self._refuse(self._guard.head_too_large)
            return
        if not self._parse(data):
            self._head_bytes += len(data)

    def _parse(self, data: bytes) -> bool:
        """Feed aiohttp's parser; whether a request head ended in what it parsed."""
        parsed = self._request_count
        super().data_received(data)
        if self._request_count == parsed:
            return False
        self._heads_complete(self._request_count - parsed)
        return True

    def _heads_complete(self, count: int) -> None:
        self._head_bytes = -1
        self._guard.head_done(self)
        messages = self._messages
        for i in range(len(messages) - count, len(messages)):
            message = messages[i][0]
            if isinstance(message, RawRequestMessage) and message.version < HttpVersion10:
                error = BadHttpMessage("HTTP/0.9 is not supported")
                messages[i] = (_ErrInfo(status=400, exc=error, message=error.message),
                               EMPTY_PAYLOAD)
        if messages:
            message, self._body = messages[-1]
            self._http11 = isinstance(message, RawRequestMessage) and \
                message.version >= HttpVersion11

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio's signature
        """The client shut its side. After a complete request with no answer begun, that is
        a half-close (the client waits for its answer) or a full close (it left), and only
        a write tells them apart. So the connection stays open, and the client is probed
        with an interim `102 Processing` (which HTTP/1.1 clients skip) now and on each tick
        until the answer begins: one that left answers the probe with a reset, a following
        write fails, and the handler is cancelled as on any disconnect. Otherwise (idle, a
        body still missing, an answer under way, HTTP/1.0 which knows no 1xx) the
        connection closes as before."""
        if self._unanswered() is not True:
            return None
        self._guard.probe_each_tick(self)
        self._write_probe()
        self._write_probe()  # a peer that left on loopback has reset already: this fails
        return True

    def probe(self) -> bool:
        state = self._unanswered()
        if state is None:  # answered (or closed): nothing more to read on it, so close
            self.force_close()
            return False
        if state:
            self._write_probe()
        return True  # an answer under way finds out by its own writes

    def _unanswered(self) -> bool | None:
        """True: a request is complete and nothing of its answer sent; False: an answer is
        being sent; None: idle, closed, or not a case for probing."""
        if self._force_close or self.transport is None or not self._http11:
            return None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            return None  # waiting for a next request
        body = self._body
        if body is not None and not body.is_eof():
            return None
        if not self._request_in_progress:
            return True  # parsed, its handler about to start
        request = self._current_request
        return request is not None and request.writer.output_size == 0

    def _write_probe(self) -> None:
        if self.transport is not None:
            self.transport.write(b"HTTP/1.1 102 Processing\r\n\r\n")

    def head_expired(self) -> None:
        """The head deadline passed. Idle (no answer under way): 408 and close. Otherwise a
        request is being answered, and after it aiohttp's keep-alive timer bounds the wait."""
        if self._force_close:  # refused, and the client has not closed since: now we do
            self.force_close()
        elif self._waiter is not None and not self._waiter.done():
            self._refuse(self._guard.head_timed_out)

    def evict(self) -> bool:
        idle = self._waiter is not None and not self._waiter.done()
        if not (idle or self._force_close):  # an answer under way: leave it
            return False
        self.force_close()  # no 408: a stalled head makes room, at once
        return True

    def _refuse(self, answer: bytes) -> None:
        """Close the connection, with `answer` first when nothing else is being sent.
        Then only our side is shut, and what the client still sends is dropped until it
        closes or one more head deadline passes: closing with unread bytes would reset the
        connection, and the reset would destroy the answer before the client reads it."""
        transport = self.transport
        waiting = self._waiter is not None and not self._waiter.done()
        if transport is None or not waiting or not transport.can_write_eof():
            self.force_close()
            return
        transport.write(answer)
        transport.write_eof()
        self._force_close = True  # aiohttp reads nothing more and ends its handler task
        if self._waiter is not None:
            self._waiter.cancel()
        self._guard.head_started(self)

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:  # an answer has begun: aiohttp's own handling
            return super().handle_error(request, status, exc, message)
        if status >= 500:
            self.log_exception("Error handling request", exc_info=exc)
        else:
            self.log_debug("rejected a malformed request: %s", type(exc).__name__)
        error = parse_error(exc, status, self.header_limit)
        if error.status == 501 and self._guard.unrouted.admit(501, 1.0) is not None:
            log_unrouted(new_id(), "", "", 501, error=error.code)  # at most one a second
        response = error.response()
        response.force_close()
        return response


class _Server(web.Server):
    guard: ConnectionGuard

    def __call__(self) -> RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)

    def pre_shutdown(self) -> None:
        self.guard.close()
        super().pre_shutdown()


class GatewayRunner(web.AppRunner):
    """An `AppRunner` whose connections answer parse errors in OpenAI's shape and keep
    the connection limits of `guard`."""

    def __init__(self, app: web.Application, server: ServerConfig, engine_slots: int,
                 **kwargs: Any) -> None:
        super().__init__(app, keepalive_timeout=server.keepalive_timeout_s, **kwargs)
        self.server_config = server
        self.engine_slots = engine_slots
        self.guard: ConnectionGuard | None = None

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # the same server; only its connections' class differs
        server.request_handler = app_handler(self._app)  # (the app is frozen by now)
        guard = ConnectionGuard(self.server_config, fd_budget(self.engine_slots),
                                asyncio.get_running_loop())
        server.guard = guard  # type: ignore[attr-defined]
        self.guard = guard
        return server
