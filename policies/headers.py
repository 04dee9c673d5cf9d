"""Which client request headers may reach an engine: the built-in allow-list, the names
no configuration can add, and the validation of `server.forward_headers` and
`server.trusted_proxies`. Pure data: no I/O, no aiohttp (router/upstream/forwarding.py applies it).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, Field

# Client headers an engine may see by default. Each is safe (no credential, no routing
# decision, no framing) and of use to an engine or its traces:
#   accept            content negotiation (JSON or an event stream)
#   user-agent        which client library sent it, in the engine's logs
#   traceparent, tracestate, baggage
#                     W3C trace context: an engine's OpenTelemetry spans join the client's
#   openai-beta       the OpenAI feature flags an OpenAI-compatible engine may honour
# Not forwarded on purpose: Idempotency-Key (a hosted API sees every tenant under the
# gateway's one account: one tenant's key could replay another's answer), OpenAI-
# Organization/-Project (billing and routing are the gateway's), anything credential-like.
DEFAULT_FORWARDED = frozenset({
    "accept", "user-agent", "traceparent", "tracestate", "baggage", "openai-beta",
})

# RFC 9110 section 7.6.1, plus what must never cross the gateway in either direction.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate",
    "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
})
# Set by the gateway itself (or describing a body the gateway re-encodes), credentials,
# and the client-address headers the gateway writes from the connection.
NEVER_FORWARDED = HOP_BY_HOP | {
    "host", "content-length", "content-type", "content-encoding", "accept-encoding",
    "authorization", "api-key", "x-api-key", "cookie", "set-cookie", "expect",
    "x-request-id", "forwarded", "x-real-ip",
}
NEVER_PREFIXES = ("x-slotgate-", "x-forwarded-")
# Names that look like credentials are refused in the config too (X-Goog-Api-Key,
# Anthropic-Api-Key, X-Auth-Token...): an engine's key is the gateway's to send.
CREDENTIAL_WORDS = ("auth", "api-key", "apikey", "token", "secret", "password", "cookie",
                    "session")
MAX_FORWARD_HEADERS = 64
MAX_TRUSTED_PROXIES = 256
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,128}")


def never_forwarded(name: str) -> bool:
    """Is `name` (lower case) one that no allow-list may let through?"""
    return (name in NEVER_FORWARDED or name.startswith(NEVER_PREFIXES)
            or any(word in name for word in CREDENTIAL_WORDS))


def _header_names(names: tuple[str, ...]) -> tuple[str, ...]:
    out: list[str] = []
    for name in names:
        if _TOKEN.fullmatch(name) is None:
            raise ValueError(f"{name[:140]!r} is not a header name (an HTTP token)")
        lower = name.lower()
        if never_forwarded(lower):
            raise ValueError(f"{name!r} is never forwarded: the gateway sets it, it is "
                             "hop-by-hop or the gateway's own, or it looks like a credential")
        if lower not in out:
            out.append(lower)
    return tuple(out)


def _networks(values: tuple[str, ...]) -> tuple[str, ...]:
    out = []
    for value in values:
        try:
            out.append(str(ipaddress.ip_network(value, strict=False)))
        except ValueError:
            raise ValueError(f"{value[:100]!r} is not an IP address or CIDR network") from None
    return tuple(out)


ForwardHeaders = Annotated[tuple[str, ...], Field(max_length=MAX_FORWARD_HEADERS),
                           AfterValidator(_header_names)]
TrustedProxies = Annotated[tuple[str, ...], Field(max_length=MAX_TRUSTED_PROXIES),
                           AfterValidator(_networks)]
