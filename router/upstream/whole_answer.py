"""A whole answer (a body already in memory) sent in one write: head and body together.

aiohttp's `Response` costs a whole answer its body's setter and content checks, then on
`prepare` a dozen calls through `StreamResponse` and its writer (keep-alive, the
headers' defaults, the head serialised and buffered, the body written past the buffered
head, the accounting, a drain). `WholeAnswer.prepare` does the same work in one pass:
aiohttp's own defaults (`Date`, `Server`, `Connection` as aiohttp sets them), the head
serialised by aiohttp's C serialiser (which refuses a control character in a header: no
injection), then one write through aiohttp's writer (which refuses a closing transport
and counts the bytes) and its drain.

Anything else goes through aiohttp's `StreamResponse.prepare` unchanged: a HEAD request,
a status whose body must be empty, a writer that is not aiohttp's plain one (compressed,
chunked, someone listening to its head or chunks), an answer already begun. It reads
aiohttp's writer's private fields (aiohttp is pinned to 3.14);
`tests/test_whole_answer.py` holds the bytes a client reads to aiohttp's own `Response`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeGuard

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpVersion10, HttpVersion11
from aiohttp.http_writer import StreamWriter, _serialize_headers
from aiohttp.web_request import BaseRequest
from multidict import CIMultiDict


class WholeAnswer(web.StreamResponse):
    """An answer whose body is `body`, with `headers` (made a multidict once)."""

    def __init__(self, body: bytes, headers: Mapping[str, str], status: int = 200) -> None:
        super().__init__(status=status, _real_headers=CIMultiDict(headers))
        self._whole = body

    @property
    def body(self) -> bytes:
        return self._whole

    async def prepare(self, request: BaseRequest) -> AbstractStreamWriter | None:
        writer = request._payload_writer  # (private: aiohttp 3.14)
        if (self.prepared or request.method == hdrs.METH_HEAD or not 200 <= self._status
                or self._status in (204, 304) or not _plain(writer)):
            if not self.prepared:  # aiohttp's own way: it writes the body at write_eof
                self._headers[hdrs.CONTENT_LENGTH] = str(len(self._whole))
            return await super().prepare(request)
        await request._prepare_hook(self)  # the app's on_response_prepare, as aiohttp does
        keep_alive = self._keep_alive
        if keep_alive is None:
            keep_alive = self._keep_alive = request.keep_alive
        headers, body, version = self._headers, self._whole, request.version
        headers[hdrs.CONTENT_LENGTH] = str(len(body))
        if hdrs.DATE not in headers:
            headers[hdrs.DATE] = rfc822_formatted_time()
        headers.setdefault(hdrs.SERVER, SERVER_SOFTWARE)
        if hdrs.CONNECTION not in headers:
            if keep_alive and version == HttpVersion10:
                headers[hdrs.CONNECTION] = "keep-alive"
            elif not keep_alive and version == HttpVersion11:
                headers[hdrs.CONNECTION] = "close"
        head = _serialize_headers(
            f"HTTP/{version.major}.{version.minor} {self._status} {self._reason}", headers)
        self._eof_sent = True  # before the write: a failed one is not tried again
        self._body_length = len(body)
        writer._write(head + body)  # raises ConnectionResetError on a closing transport
        await writer.drain()
        return writer

    async def write_eof(self, data: bytes = b"") -> None:
        if (self._payload_writer is not None and not self._eof_sent
                and not self._must_be_empty_body):  # prepared aiohttp's way: as its Response
            data = self._whole
        await super().write_eof(data)


def _plain(writer: object) -> TypeGuard[StreamWriter]:
    """aiohttp's writer, nothing written yet, and no one transforming or watching it."""
    return (type(writer) is StreamWriter and writer.output_size == 0
            and not writer.chunked and writer._compress is None and writer.length is None
            and writer._on_chunk_sent is None and writer._on_headers_sent is None
            and writer.on_body_write is None)
