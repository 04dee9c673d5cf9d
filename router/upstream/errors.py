"""The upstream client's errors: UpstreamError > ConnectFailed | ResponseTimeout |
ResponseDropped > BadResponse | StaleBytes. The proxy tells the engine's faults apart by them."""

from __future__ import annotations


class UpstreamError(Exception):
    """The upstream exchange failed."""


class ConnectFailed(UpstreamError):
    """No connection could be opened (`timeout`: the connect timeout passed)."""

    def __init__(self, message: str, *, timeout: bool) -> None:
        super().__init__(message)
        self.timeout = timeout


class ResponseDropped(UpstreamError):
    """The connection was lost after the request was sent, before the response ended."""


class BadResponse(ResponseDropped):
    """The engine's bytes are not valid HTTP/1.1, or its headers exceed the limits."""


class StaleBytes(ResponseDropped):
    """A reused connection had bytes from the engine before the request was fully written:
    they answer no request of ours. The request never reached the engine whole, so it is
    sent again on a new connection (whatever its method)."""


class ResponseTimeout(UpstreamError):
    """No body byte within the first-byte timeout (`first_byte`), or a gap in the body
    longer than the idle timeout. The connection is closed: the engine aborts."""

    def __init__(self, message: str, *, first_byte: bool) -> None:
        super().__init__(message)
        self.first_byte = first_byte

