"""Forward one admitted request to its backend and relay the answer.

Streams are relayed event by event as they arrive (no buffering); non-streams are
read whole (bounded). Any early exit closes the upstream connection, which is how an
engine learns to abort the generation, except that a backend with `on_disconnect: drain`
reads a non-streaming answer whose client left to its end, keeping the slot, because such
an engine finishes the work anyway. Upstream URLs and keys come only from config.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, quote_plus

import orjson
from aiohttp import web
from multidict import MultiMapping

from policies.config import BackendConfig
from policies.headers import HOP_BY_HOP
from policies.health import failures
from policies.health.failures import FailureKind
from router.apis import context_window
from router.apis.context_window import overflow
from router.apis.dialect import Relay, Translation
from router.common.errors import ApiError
from router.common.parsed import Endpoint
from router.common.sse import MAX_EVENT_BYTES, SSE_HEADERS, EventRelay, EventTooLarge
from router.common.usage import Usage
from router.upstream.answers import answer_object, opening_of, usage_from_answer
from router.upstream.capture import Capture, CapturingRelay
from router.upstream.client import HttpPool
from router.upstream.client_stream import ClientGone, ClientStream
from router.upstream.errors import BadResponse, ConnectFailed, ResponseDropped, ResponseTimeout
from router.upstream.failures import UpstreamFailure
from router.upstream.forwarding import DEFAULT, Forwarding, connection_listed, forward_headers
from router.upstream.response import Response
from router.upstream.whole_answer import WholeAnswer
from router.upstream.wire import Target

_NOT_RETURNED = HOP_BY_HOP | {
    "content-length", "content-encoding", "content-type", "date", "server", "set-cookie",
    "www-authenticate", "proxy-authenticate",  # about the gateway's key, not the client's
    "x-request-id",  # the gateway's own is on every answer
}
ERROR_BODY_LIMIT = 64 * 1024

@dataclass(slots=True)
class Upstream:
    """One engine replica of a backend as the proxy sees it: where, with which key, over
    which connections."""

    name: str  # the backend's
    config: BackendConfig
    base_url: str  # the OpenAI base, ending in /v1
    http: HttpPool  # kept across config reloads: one pool of keep-alive connections
    key_env: str | None = None  # the environment variable holding its API key
    replica: str = ""  # its endpoint name (the backend's own for a group of one)
    draining: int = field(default=0, init=False)  # answers read for clients that left
    _targets: dict[str, Target] = field(default_factory=dict, init=False, repr=False)

    def target(self, path: str) -> Target:
        """The URL of `path` under the backend's /v1 base (parsed once per path)."""
        target = self._targets.get(path)
        if target is None:
            target = self._targets[path] = Target.parse(self.base_url + path)
        return target

    def auth_headers(self) -> dict[str, str]:
        auth = self.auth_header()
        return {"Authorization": auth} if auth else {}

    def auth_header(self) -> str | None:
        key = self.secret()
        if key and not key.isprintable():  # a line break would split the header
            raise ApiError(500, f"The key of backend '{self.name}' (${self.key_env})"
                           " holds a control character.", "server_error", "backend_key_invalid")
        return f"Bearer {key}" if key else None

    def secret(self) -> str | None:
        """The backend's API key (from its environment variable), if it has one."""
        env = self.key_env
        return os.environ.get(env) or None if env else None


@dataclass(slots=True)
class Attempt:
    """One try of a request on one backend: what to send, and what has happened so far
    (read by the caller on every exit, a cancellation included)."""

    request: web.Request
    upstream: Upstream
    endpoint: Endpoint
    body: bytes
    stream: bool
    strip_usage: bool  # the client did not ask for the usage chunk
    request_id: str
    headers: dict[str, str]  # the gateway's own headers on the answer
    max_response_bytes: int
    rules: Forwarding = DEFAULT  # which client headers pass
    preamble: bytes = b""  # said right after a stream's headers, before its first chunk
    # An already prepared SSE response (a stream that had to queue); else set once the
    # stream's headers went out.
    response: web.StreamResponse | None = None
    usage: Usage = field(default_factory=Usage)
    status: int = 0  # the backend's
    first_byte_at: float | None = None
    on_first_byte: Callable[[float], None] | None = None  # called with first_byte_at, once
    streaming: bool = False  # bytes of the answer reached the client
    # The answer rendered in another client API (router.apis.dialect); None: as it is.
    translation: Translation | None = None
    # The trace context sent in place of the client's (tracing on): traceparent, tracestate.
    trace: dict[str, str] | None = None
    capture: Capture | None = None  # a sampled answer's copy, for a shadow comparison



def returned_headers(headers: MultiMapping[str], secret: str | None = None
                     ) -> dict[str, str]:
    """The backend's headers a client may see: no hop-by-hop ones, none about the
    gateway's own credentials, none that carry the backend key (an echoing engine), and
    none of the names the gateway sets on an answer (`x-request-id`, `x-slotgate-*`), so
    that its own can be added to the dict as they are, case aside."""
    listed = connection_listed(headers)
    drop = _NOT_RETURNED | listed if listed else _NOT_RETURNED
    return {k: v for k, v in headers.items()
            if (low := k.lower()) not in drop and not low.startswith("x-slotgate-")
            and not (secret and secret in v)}


def redact(text: str, secret: str | None) -> str:
    """`text` without the backend key in any spelling an engine might echo it in."""
    if not secret:
        return text
    for spelling in (secret, quote(secret, safe=""), quote_plus(secret)):
        text = text.replace(spelling, "[redacted]")
    return text


def forward(attempt: Attempt) -> Coroutine[Any, Any, web.StreamResponse]:
    """Send the attempt upstream and answer the client (awaited by the caller: the usual
    case adds no coroutine frame of its own to the request's await chain). For a
    non-streaming request to a backend with `on_disconnect: drain`, the exchange runs on
    its own, so that the client leaving (the caller's task cancelled) does not close the
    upstream connection: the caller holds the slot until the engine's answer has been read
    to its end."""
    if attempt.stream or attempt.upstream.config.on_disconnect != "drain":
        return _exchange(attempt)
    return _forward_draining(attempt)


async def _forward_draining(attempt: Attempt) -> web.StreamResponse:
    upstream = attempt.upstream
    work = asyncio.ensure_future(_exchange(attempt))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        await _drain(upstream, work)
        raise


async def _drain(upstream: Upstream, work: asyncio.Future[web.StreamResponse]) -> None:
    """Wait out an answer nobody will read (bounded by the backend's first-byte and idle
    timeouts); cancelled again (shutdown), close the connection after all."""
    upstream.draining += 1
    try:
        await asyncio.wait({work})
    except asyncio.CancelledError:
        work.cancel()
        raise
    finally:
        upstream.draining -= 1
    if not work.cancelled():
        work.exception()  # an upstream failure nobody can be told of: retrieved, dropped


async def _exchange(attempt: Attempt) -> web.StreamResponse:
    """Raises UpstreamFailure (the caller answers it, in-band once a stream has begun),
    ClientGone, and ApiError for a backend key the gateway cannot send."""
    request, upstream, stream = attempt.request, attempt.upstream, attempt.stream
    response = attempt.response
    cfg = upstream.config
    headers = forward_headers(request.headers, attempt.request_id, upstream.auth_header(),
                              request.remote, request.scheme, attempt.rules, attempt.trace)
    up: Response | None = None
    done = False
    try:
        # Its first-byte and idle deadlines: the pool's coarse ticker, no timer per request.
        up = await upstream.http.request(
            "POST", upstream.target(attempt.endpoint._value_.removeprefix("/v1")), headers,
            attempt.body, connect_timeout_s=cfg.connect_timeout_s,
            first_byte_timeout_s=cfg.first_byte_timeout_s, idle_timeout_s=cfg.idle_timeout_s)
        attempt.status = up.status
        if up.status != 200:
            raise await _upstream_error(up, upstream.name, upstream.secret())
        if not stream:
            whole = _whole(attempt, up, await _read_bounded(
                up, attempt.max_response_bytes, upstream.name))
            done = True
            return whole
        events = _relay(attempt)
        chunk = await up.readany()
        attempt.first_byte_at = time.perf_counter()
        if attempt.on_first_byte is not None:
            attempt.on_first_byte(attempt.first_byte_at)
        # Nothing of the answer goes out before the engine's first valid event: a stream of
        # garbage is a fault the request can leave for a sibling.
        opening, ended = await opening_of(events, chunk, up, upstream.name)
        if response is None:
            response = web.StreamResponse(headers={**SSE_HEADERS, **attempt.headers})
            attempt.response = response
            await _send(response.prepare(request))
            if attempt.preamble:
                await _send(response.write(attempt.preamble))
        attempt.streaming = True
        client = ClientStream(response, request.transport, cfg.idle_timeout_s)
        if opening:
            await client.write(opening)
        if not ended:
            while chunk := await up.readany():
                out_bytes = events.feed(chunk)
                if out_bytes and not client.put(out_bytes):
                    await client.write(out_bytes)
            tail = events.flush()  # an unterminated last event is passed on as it is
            if tail:
                await client.write(tail)
        done = True
        await _send(response.write_eof())
        return response
    except (ConnectFailed, ResponseTimeout, EventTooLarge, ResponseDropped) as exc:
        raise _failure(exc, upstream.name, cfg, attempt.status != 0) from None
    finally:
        if up is not None:  # unless done, the connection is dropped: the engine aborts
            up.release() if done else up.close()


def _relay(attempt: Attempt) -> Relay:
    """A stream's relay: the engine's events passed on (or translated), copied as they
    pass for a sampled answer."""
    events: Relay = (EventRelay(attempt.strip_usage, attempt.usage) if attempt.translation
                     is None else attempt.translation.relay(attempt.usage))
    return events if attempt.capture is None else CapturingRelay(events, attempt.capture)


def _whole(attempt: Attempt, up: Response, raw: bytes) -> WholeAnswer:
    """A whole (non-streamed) answer, read: checked, its usage taken, translated, sent with
    the engine's headers that may be returned and the gateway's own."""
    attempt.first_byte_at = time.perf_counter()  # (its whole body, not streamed)
    if attempt.on_first_byte is not None:
        attempt.on_first_byte(attempt.first_byte_at)
    upstream = attempt.upstream
    answer = answer_object(raw, attempt.endpoint, upstream.name)  # the one parse
    if attempt.capture is not None:
        attempt.capture.answer = answer
    usage_from_answer(answer, attempt.usage)
    if attempt.translation is not None:
        raw = attempt.translation.answer(answer)
    # (none of the engine's names is one of the gateway's: one multidict, the answer's)
    headers_out = returned_headers(up.headers, upstream.secret())
    headers_out.update(attempt.headers)
    headers_out["Content-Type"] = "application/json"
    return WholeAnswer(raw, headers_out)


def _failure(exc: Exception, name: str, cfg: BackendConfig, begun: bool) -> UpstreamFailure:
    """What a failed exchange with backend `name` was, for the health checks and the
    client (`begun`: the answer's status had arrived)."""
    if isinstance(exc, ConnectFailed):
        if exc.timeout:
            return UpstreamFailure(FailureKind.CONNECT_TIMEOUT, name,
                                   f"Backend '{name}' is unreachable (connect timeout).")
        return UpstreamFailure(FailureKind.REFUSED, name,
                               f"Backend '{name}' is unreachable (connection failed).")
    if isinstance(exc, ResponseTimeout):
        if exc.first_byte:
            return UpstreamFailure(FailureKind.FIRST_BYTE_TIMEOUT, name,
                                   f"Backend '{name}' sent no first byte within "
                                   f"{cfg.first_byte_timeout_s:g} s.", status=504)
        return UpstreamFailure(FailureKind.IDLE_TIMEOUT, name, f"Backend '{name}' went idle "
                               f"for {cfg.idle_timeout_s:g} s.", status=504)
    if isinstance(exc, EventTooLarge):
        return UpstreamFailure(FailureKind.TOO_LARGE, name,
                               f"Backend '{name}' sent an event over {MAX_EVENT_BYTES} bytes.")
    why = type(exc).__name__  # ResponseDropped
    if begun:
        return UpstreamFailure(FailureKind.DROPPED, name,
                               f"Backend '{name}' dropped the connection: {why}.")
    kind = FailureKind.BAD_RESPONSE if isinstance(exc, BadResponse) else FailureKind.REFUSED
    return UpstreamFailure(kind, name, f"Backend '{name}' is unreachable: {why}.")


async def _send(write: Any) -> None:
    try:
        await write
    except ConnectionResetError:
        raise ClientGone from None


async def _read_bounded(up: Response, limit: int, name: str) -> bytes:
    parts: list[bytes] = []
    size = 0
    while chunk := await up.readany():
        size += len(chunk)
        if size > limit:
            raise UpstreamFailure(FailureKind.TOO_LARGE, name,
                                  f"Backend answer exceeds {limit} bytes.")
        parts.append(chunk)
    return b"".join(parts)


def _window_fields(err: dict[str, Any]) -> str:
    """llama.cpp tells a context overflow's numbers in fields of its error, not in its
    message: they are added to the message, in its own names."""
    prompt, window = err.get("n_prompt_tokens"), err.get("n_ctx")
    if type(prompt) is int and type(window) is int:
        return f" (n_prompt_tokens: {prompt}, n_ctx: {window})"
    return ""


async def _upstream_error(up: Response, name: str, secret: str | None) -> UpstreamFailure:
    """Relay the backend's own error (status and OpenAI-shaped message) when it has one,
    without the backend key. A 401/403 is about the gateway's credentials, not the
    client's: it becomes a 502 that says so, with nothing of the backend's message."""
    kind = failures.answered(up.status)
    if kind is FailureKind.UPSTREAM_AUTH:  # the gateway's config: no engine fault, no retry
        return UpstreamFailure(kind, name, f"Backend '{name}' refused the gateway's "
                               f"credentials (HTTP {up.status}); check its api_key_env.")
    raw = await up.read(ERROR_BODY_LIMIT)
    message = f"Backend '{name}' answered HTTP {up.status}."
    type_, code = "api_error", None
    try:
        err = orjson.loads(raw).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        err = None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        message = err["message"] + _window_fields(err)
        type_ = err["type"] if isinstance(err.get("type"), str) else type_
        code = err["code"] if isinstance(err.get("code"), str) else code
    elif isinstance(err, str):
        message = err
    message = redact(message, secret)
    status = up.status if 400 <= up.status <= 599 else 502
    if status == 400 and code is None and overflow(message) is not None:
        code = context_window.CODE  # clients act on OpenAI's code (and Anthropic's words)
    headers = {}
    if status == 429 and "Retry-After" in up.headers:
        headers["Retry-After"] = up.headers["Retry-After"]
    return UpstreamFailure(kind, name, message, status, type_, code, up.status, headers)
