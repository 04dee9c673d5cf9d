"""The request headers an engine receives: what the gateway sets itself, the client's
headers on the allow-list (policies/headers.py, plus `server.forward_headers`), and the
client's address in `Forwarded` / `X-Forwarded-*`, written from the TCP connection. A
client's own `Forwarded` / `X-Forwarded-*` are kept (and appended to) only when the peer
is one of `server.trusted_proxies`; otherwise they are dropped. Built once per config: the
per-request work is one set lookup per header."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from multidict import CIMultiDictProxy, MultiMapping

from policies.config import ServerConfig
from policies.headers import DEFAULT_FORWARDED
from router.tracing.context import bounded

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# A Host value safe to repeat: a name or an IP literal, an optional port.
_HOST = re.compile(r"(?:[A-Za-z0-9.\-_]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?")
_PROTOS = frozenset({"http", "https"})


@dataclass(frozen=True, slots=True)
class Forwarding:
    """One config's rules: the client headers allowed through, the trusted proxies."""

    allowed: frozenset[str]
    trusted: tuple[Network, ...] = ()

    @classmethod
    def of(cls, server: ServerConfig) -> Forwarding:
        """The rules of `server` (cached: the same config object gives the same rules)."""
        cached = _cache.get(id(server))
        if cached is not None and cached[0] is server:
            return cached[1]
        made = cls(DEFAULT_FORWARDED | frozenset(server.forward_headers),
                   tuple(ipaddress.ip_network(n) for n in server.trusted_proxies))
        _cache.clear()  # one config at a time (a reload replaces it)
        _cache[id(server)] = (server, made)
        return made

    def trusts(self, peer: str | None) -> bool:
        if not self.trusted or not peer:
            return False
        try:
            address = ipaddress.ip_address(peer.split("%", 1)[0])  # no IPv6 zone
        except ValueError:
            return False
        return any(address in network for network in self.trusted)


_cache: dict[int, tuple[ServerConfig, Forwarding]] = {}
# (peer, scheme, Host) -> the client-address headers written for it (untrusted peers only)
_addresses: dict[tuple[str | None, str, str | None], list[tuple[str, str]]] = {}
_MAX_ADDRESSES = 4096
DEFAULT = Forwarding(DEFAULT_FORWARDED)
# The W3C trace context: the client's passes as it is, unless the gateway traces (then ours).
TRACE_CONTEXT = frozenset({"traceparent", "tracestate"})


def forward_headers(
    headers: CIMultiDictProxy[str], request_id: str, auth: str | None,
    peer: str | None = None, scheme: str = "http", rules: Forwarding = DEFAULT,
    trace: dict[str, str] | None = None,
) -> list[tuple[str, str]]:
    """The headers sent upstream for a request that came with `headers` from `peer`;
    with `trace` (tracing on), its trace context replaces the client's."""
    allowed = rules.allowed
    if trace is not None:
        allowed = allowed - TRACE_CONTEXT
    listed = connection_listed(headers)
    if listed:
        allowed = allowed - listed
    out = [(k, v) for k, v in headers.items() if k.lower() in allowed]
    if "baggage" in headers or "tracestate" in headers:  # bounded, else dropped
        out = bounded(headers, out)
    out += (("Content-Type", "application/json"), ("Accept-Encoding", "identity"),
            ("X-Request-Id", request_id))
    if auth:
        out.append(("Authorization", auth))
    if trace is not None:
        out += trace.items()
    if rules.trusted and rules.trusts(peer):
        out += _client_address(headers, peer, scheme, True)
    else:  # the usual case: the same few peers and hosts again and again
        key = (peer, scheme, headers.get("Host"))
        address = _addresses.get(key)
        if address is None:
            if len(_addresses) >= _MAX_ADDRESSES:
                _addresses.clear()
            address = _addresses[key] = _client_address(headers, peer, scheme, False)
        out += address
    return out


def _client_address(headers: CIMultiDictProxy[str], peer: str | None, scheme: str,
                    trusted: bool) -> list[tuple[str, str]]:
    """Forwarded (RFC 7239) and the X-Forwarded-* trio, from the connection."""
    host = headers.get("Host")
    if host is not None and _HOST.fullmatch(host) is None:
        host = None  # not worth repeating: left out
    node = ("unknown" if not peer else f'"[{peer}]"' if ":" in peer else peer)
    element = f"for={node};proto={scheme}" + (f';host="{host}"' if host else "")
    xff, forwarded, proto, xfh = peer or "unknown", element, scheme, host
    if trusted:  # a proxy we trust: what it says of its own client is kept, ours appended
        prior = ", ".join(headers.getall("X-Forwarded-For", ()))
        xff = f"{prior}, {xff}" if prior else xff
        prior = ", ".join(headers.getall("Forwarded", ()))
        forwarded = f"{prior}, {forwarded}" if prior else forwarded
        claimed = headers.get("X-Forwarded-Proto", "").strip().lower()
        proto = claimed if claimed in _PROTOS else proto
        claimed = headers.get("X-Forwarded-Host", "").strip()
        xfh = claimed if _HOST.fullmatch(claimed) else xfh
    out = [("Forwarded", forwarded), ("X-Forwarded-For", xff), ("X-Forwarded-Proto", proto)]
    if xfh:
        out.append(("X-Forwarded-Host", xfh))
    return out


def connection_listed(headers: MultiMapping[str]) -> frozenset[str]:
    if "Connection" not in headers:  # the usual case: nothing more to drop
        return frozenset()
    listed = headers.getall("Connection", ())
    return frozenset(name.strip().lower() for value in listed for name in value.split(","))
