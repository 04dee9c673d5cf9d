"""The wire dialect of a request: how its body is parsed into the gateway's request, and
how its errors, its early stream (queue keep-alives, the slot-granted frame) and its
answer are rendered for the client. `OPENAI` is the identity (chat and completions, no
translation: the relay passes the engine's events on untouched); another client API
(Anthropic Messages, later OpenAI Responses) subclasses `Dialect` and translates.

A dialect is chosen once per request (by its endpoint), so nothing is added per relayed
chunk for the OpenAI dialect: its `translation` is None and the proxy's fast path runs.
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from policies.config import ServerConfig
from router.common.errors import ApiError
from router.common.parsed import Endpoint, ParsedRequest
from router.common.sse import queue_frame, start_frame
from router.common.usage import Usage
from router.openai_api import parse_request


class Relay(Protocol):
    """Engine stream bytes in, client stream bytes out (router.common.sse.EventRelay's shape)."""

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...

    @property
    def valid(self) -> bool:
        """Has the engine sent one valid event (a JSON object) yet?"""
        ...


class Translation(Protocol):
    """One request's answer, rendered in its client's API from the engine's chat answer."""

    def answer(self, chat: dict[str, Any]) -> bytes:
        """The whole (non-streaming) answer's body, from the engine's (parsed) answer."""
        ...

    def relay(self, usage: Usage) -> Relay:
        """The stream's translator; it records the engine's usage in `usage`."""
        ...


class Dialect:
    """OpenAI's own dialect: errors as {"error": {...}}, queue reports as SSE comments (or
    the named queue events), the engine's answer passed on as it is."""

    name = "openai"

    def parse(self, raw: bytes, endpoint: Endpoint, limits: ServerConfig) -> ParsedRequest:
        return parse_request(raw, endpoint, limits)

    def translation(self, parsed: ParsedRequest, request_id: str) -> Translation | None:
        """How the answer is translated; None: passed on untouched (the fast path)."""
        return None

    def error_response(self, err: ApiError, retry_after_s: int) -> web.Response:
        """`err` as a response (`retry_after_s`: a Retry-After where the API needs one)."""
        return err.response()

    def error_event(self, err: ApiError) -> bytes:
        """`err` in-band, once a stream's 200 has gone out."""
        return err.sse_event()

    def queue_frame(self, position: int, eta_s: float, pool: str, events: bool) -> bytes:
        """A waiting stream's report (`events`: the client asked for named queue events)."""
        return queue_frame(position, eta_s, pool, events)

    def start_frame(self, backend: str, reason: str | None, queue_wait_ms: float,
                    events: bool, endpoint: str | None = None) -> bytes:
        """Said when the slot is granted, before the answer."""
        return start_frame(backend, reason, queue_wait_ms, events, endpoint)


OPENAI = Dialect()
