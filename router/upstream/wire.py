"""What goes on the wire to an engine: its URLs, parsed once (`Target`), requests encoded
with no header injection possible (`encode`), and HTTP/1.1's rule for a body that ends
with the connection (`until_close`). Used by router/upstream/client.py and connection.py."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from multidict import CIMultiDict

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_NOT_SENT = frozenset({"host", "content-length", "transfer-encoding", "connection"})
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
BODYLESS = frozenset({"GET", "HEAD"})
# Header name -> sent (a token, not one written here): checked once each, in a bounded cache.
_NAMES: dict[str, bool] = {}

Origin = tuple[bool, str, int]


@dataclass(frozen=True, slots=True)
class Target:
    """One upstream URL, parsed once."""

    tls: bool
    host: str
    port: int
    path: str  # with the query
    host_header: str
    origin: Origin = field(init=False, repr=False, compare=False)  # the pool's key

    def __post_init__(self) -> None:
        object.__setattr__(self, "origin", (self.tls, self.host, self.port))

    @classmethod
    def parse(cls, url: str) -> Target:
        if not url.isascii() or any(c <= " " or c == "\x7f" for c in url):
            raise ValueError(f"invalid upstream URL {url!r}")
        parts = urlsplit(url)  # raises ValueError on a bad port or IPv6 literal
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"upstream URL {url!r} is not http:// or https://")
        if "@" in parts.netloc:
            raise ValueError(f"upstream URL {url!r} has userinfo")
        host, port = parts.hostname, parts.port
        if not host or port == 0:
            raise ValueError(f"upstream URL {url!r} has no host or port")
        tls = parts.scheme == "https"
        default = 443 if tls else 80
        port = port or default
        name = f"[{host}]" if ":" in host else host
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(tls, host, port, path, name if port == default else f"{name}:{port}")


def _sent(name: str) -> bool:
    sent = _NAMES.get(name)
    if sent is None:
        if _TOKEN.fullmatch(name) is None:
            raise ValueError(f"invalid header name {name!r}")
        sent = name.lower() not in _NOT_SENT
        if len(_NAMES) < 1024:
            _NAMES[name] = sent
    return sent


def encode(method: str, target: Target, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
    if method not in _METHODS and _TOKEN.fullmatch(method) is None:
        raise ValueError(f"invalid HTTP method {method!r}")
    lines = [method, " ", target.path, " HTTP/1.1\r\nHost: ", target.host_header, "\r\n"]
    if body or method not in BODYLESS:
        lines.append(f"Content-Length: {len(body)}\r\n")
    for name, value in headers:
        if "\r" in value or "\n" in value or "\0" in value:
            raise ValueError(f"invalid value for header {name!r}")  # not shown: may be a secret
        if _NAMES[name] if name in _NAMES else _sent(name):  # (a name seen: no call)
            lines += (name, ": ", value, "\r\n")
    lines.append("\r\n")
    # surrogateescape: header values decoded that way by aiohttp's server go out unchanged.
    return "".join(lines).encode("utf-8", "surrogateescape") + body


def until_close(status: int, headers: CIMultiDict[str]) -> bool:
    """Whether the body is framed by the connection closing (llhttp's rules)."""
    if status in (204, 304):
        return False
    codings = headers.getall("Transfer-Encoding", ())
    if codings:
        return codings[-1].rsplit(",", 1)[-1].strip().lower() != "chunked"
    return "Content-Length" not in headers
