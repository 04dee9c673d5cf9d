"""Parse and validate OpenAI requests; build OpenAI-shaped error responses.

Errors the gateway answers itself (all render as {"error": {message, type, param, code}}):

    ApiError                    status, type and code given per case:
      400 invalid_request_error bad JSON, missing or malformed fields
      404 invalid_request_error unknown model (code model_not_found)
      413 invalid_request_error body over the limit (code request_too_large)
      415 invalid_request_error a body that is not JSON (code unsupported_media_type)
      429 rate_limit_error      every pool and queue full (code queue_full)
      502 / 503 / 504           upstream unreachable, queue timeout, upstream timeout

Only what the gateway itself needs is validated; every other field passes through.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web


class Endpoint(enum.StrEnum):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


@dataclass(eq=False)
class ApiError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    code: str | None = None
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> web.Response:
        return web.Response(
            status=self.status,
            body=orjson.dumps(self.body()),
            content_type="application/json",
            headers=self.headers,
        )

    def sse_event(self) -> bytes:
        """The in-band form, once a stream's 200 has already been sent."""
        return b"data: " + orjson.dumps(self.body()) + b"\n\n"


def not_found(request: web.BaseRequest) -> web.Response:
    return ApiError(404, f"Not Found: {request.method} {request.path}",
                    code="not_found").response()


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


@dataclass(slots=True)
class ParsedRequest:
    endpoint: Endpoint
    body: dict[str, Any]  # the client's JSON object, forwarded with `model` rewritten
    model: str
    stream: bool
    wants_usage: bool  # the client itself asked for stream_options.include_usage
    max_tokens: int | None
    raw: bytes = b""  # the body as received, for cheap size estimates
    queue_events: bool = False  # body asked for named queue events: slotgate.queue_events


async def read_body(request: web.BaseRequest, limit: int) -> bytes:
    """The request body, refusing with 413 before reading past `limit` bytes."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"Request body exceeds the limit of {limit} bytes.", code="request_too_large"
    )


# Fields some SDKs and proxies read as "send this elsewhere" or "use these credentials":
# the gateway alone decides where a request goes and with which key.
DESTINATION_FIELDS = frozenset({
    "api_base", "base_url", "api_key", "api_version", "api_type", "organization",
    "custom_llm_provider", "deployment_id", "extra_headers", "proxy", "endpoint",
})


def check_content_type(request: web.BaseRequest) -> None:
    """415 unless the body is declared JSON (no Content-Type at all is accepted)."""
    declared = request.headers.get("Content-Type")
    if declared is not None and request.content_type != "application/json":
        raise ApiError(415, f"Content-Type must be application/json, not {declared[:100]!r}.",
                       code="unsupported_media_type")


def parse_request(raw: bytes, endpoint: Endpoint, max_messages: int = 2048) -> ParsedRequest:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"Request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise invalid("Request body must be a JSON object.")
    steering = DESTINATION_FIELDS.intersection(body)
    if steering:
        name = sorted(steering)[0]
        raise invalid(f"'{name}' is not accepted: the gateway decides where requests go.", name)

    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("'model' is required and must be a non-empty string.", "model")

    if endpoint is Endpoint.CHAT:
        _check_messages(body.get("messages"), max_messages)
    else:
        _check_prompt(body.get("prompt"))

    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise invalid("'stream' must be a boolean.", "stream")

    wants_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise invalid("'stream_options' must be an object.", "stream_options")
        wants_usage = options.get("include_usage") is True

    max_tokens = None
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise invalid(f"'{name}' must be a positive integer.", name)
        max_tokens = value
        break
    ours = body.get("slotgate")
    if ours is not None and not isinstance(ours, dict):
        raise invalid("'slotgate' must be an object.", "slotgate")
    queue_events = isinstance(ours, dict) and ours.get("queue_events") is True
    return ParsedRequest(endpoint, body, model, stream, wants_usage, max_tokens, raw,
                         queue_events)


def _check_messages(messages: object, limit: int) -> None:
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' is required and must be a non-empty array.", "messages")
    if len(messages) > limit:
        raise invalid(f"'messages' holds {len(messages)} messages; the limit is {limit}.",
                      "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise invalid(f"'messages[{i}]' must be an object with a string 'role'.", "messages")


def _check_prompt(prompt: object) -> None:
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt:
        return  # strings, token arrays or arrays of those: the engine checks the details
    raise invalid("'prompt' is required: a string or a non-empty array.", "prompt")


def upstream_body(parsed: ParsedRequest, upstream_model: str) -> bytes:
    """The body sent upstream: the client's, with `model` rewritten and usage asked for."""
    body = dict(parsed.body)
    body["model"] = upstream_model
    body.pop("slotgate", None)  # the gateway's own options never reach an engine
    if parsed.stream and not parsed.wants_usage:
        options = dict(body.get("stream_options") or {})
        options["include_usage"] = True
        body["stream_options"] = options
    return orjson.dumps(body)
