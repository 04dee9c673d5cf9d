"""The Anthropic Messages dialect: a Messages request parsed into a chat request, its
errors in Anthropic's shape (with a Retry-After on every 429 and 503: an Anthropic client
retries a 429 without one at once, endlessly), `ping` events while it waits, and the
engine's chat answer translated to a message or to Anthropic's event stream.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from policies.config import ServerConfig
from policies.scheduler.capabilities import body_tokens
from router.apis import context_window
from router.apis.anthropic_answer import to_message
from router.apis.anthropic_request import Unsupported, to_chat
from router.apis.anthropic_stream import PING, MessageStream, event
from router.apis.dialect import Dialect, Relay
from router.common.errors import ApiError, invalid
from router.common.parsed import Endpoint, ParsedRequest
from router.common.usage import Usage
from router.openai_api import parse_request
from router.request.json_bounds import check_bounds

# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
_TYPES = {400: "invalid_request_error", 401: "authentication_error",
          403: "permission_error", 404: "not_found_error", 413: "request_too_large",
          429: "rate_limit_error", 500: "api_error", 503: "overloaded_error",
          529: "overloaded_error"}


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "invalid_request_error" if status < 500 else "api_error"


def error_body(err: ApiError) -> bytes:
    message = err.message
    if err.code == context_window.CODE:  # an engine's overflow, in the words Claude Code reads
        found = context_window.overflow(message)
        message = message if found is None else context_window.anthropic_message(found)
    return orjson.dumps({"type": "error", "error": {"type": error_type(err.status),
                                                    "message": message}})


def parse_messages(raw: bytes, limits: ServerConfig, *, count_only: bool = False
                   ) -> tuple[dict[str, object], dict[str, object]]:
    """(the client's body, its chat translation); a 400 for what cannot be translated."""
    breach = check_bounds(raw, limits.max_json_depth, limits.max_json_values)
    if breach is not None:
        raise invalid(breach.message, breach.param)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"Request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise invalid("Request body must be a JSON object.")
    try:
        return body, to_chat(body, count_only=count_only)
    except Unsupported as exc:
        err = invalid(exc.message, exc.param)
        err.model = body["model"] if isinstance(body.get("model"), str) else None
        raise err from None


class MessagesTranslation:
    """One Messages request's answer: the engine's chat answer as a message or stream."""

    __slots__ = ("input_estimate", "message_id", "model")

    def __init__(self, message_id: str, model: str, input_estimate: int) -> None:
        self.message_id, self.model, self.input_estimate = message_id, model, input_estimate

    def answer(self, chat: dict[str, Any]) -> bytes:
        return orjson.dumps(to_message(chat, self.message_id, self.model,
                                       self.input_estimate))

    def relay(self, usage: Usage) -> Relay:
        return MessageStream(self.message_id, self.model, usage, self.input_estimate)


class AnthropicDialect(Dialect):
    name = "anthropic"

    def parse(self, raw: bytes, endpoint: Endpoint, limits: ServerConfig) -> ParsedRequest:
        _, chat = parse_messages(raw, limits)
        # The chat body goes through the chat checks (message count, sequences); the raw
        # Anthropic body stays for the size estimates.
        parsed = parse_request(orjson.dumps(chat), Endpoint.CHAT, limits)
        parsed.raw = raw
        return parsed

    def translation(self, parsed: ParsedRequest, request_id: str) -> MessagesTranslation:
        return MessagesTranslation(f"msg_{request_id}", parsed.model, input_estimate(parsed.raw))

    def error_response(self, err: ApiError, retry_after_s: int) -> web.Response:
        headers = dict(err.headers)
        if err.status in (429, 503) and not any(k.lower() == "retry-after" for k in headers):
            headers["Retry-After"] = str(retry_after_s)
        response = web.Response(status=err.status, body=error_body(err),
                                content_type="application/json", headers=headers)
        if err.close:
            response.force_close()
        return response

    def error_event(self, err: ApiError) -> bytes:
        return b"event: error\ndata: " + error_body(err) + b"\n\n"

    def queue_frame(self, position: int, eta_s: float, pool: str, events: bool) -> bytes:
        return super().queue_frame(position, eta_s, pool, events) if events else PING

    def start_frame(self, backend: str, reason: str | None, queue_wait_ms: float,
                    events: bool, endpoint: str | None = None) -> bytes:
        if events:
            return super().start_frame(backend, reason, queue_wait_ms, events, endpoint)
        return PING


def input_estimate(raw: bytes) -> int:
    """The gateway's generous estimate of a request's input tokens (from its body's size,
    as admission estimates it)."""
    return body_tokens(raw)


ANTHROPIC = AnthropicDialect()
__all__ = ["ANTHROPIC", "AnthropicDialect", "event", "input_estimate", "parse_messages"]
