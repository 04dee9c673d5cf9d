"""The OpenAI Responses dialect. A request for a model whose primary serves the Responses
API itself is passed through (`RESPONSES_PASSED`: OpenAI's dialect, the engine's answer
and events untouched; but, unless the route allows stored responses, `store` is sent as
false and `previous_response_id`/`conversation` refused, since the engine's account is
every tenant's); any other is translated to a chat completions request (`RESPONSES`, or
`RESPONSES_REFUSING` where the route refuses hosted tools rather than dropping them),
and the engine's chat answer to a response object or to the Responses event stream.
Errors are OpenAI's shape either way; a waiting stream's keep-alives are SSE comments,
which a Responses client skips.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from policies.apis import Api
from policies.config import Config, HostedTools, ServerConfig
from policies.scheduler.capabilities import body_tokens
from router.apis.dialect import OPENAI, Dialect, Relay
from router.apis.responses_answer import Echo, to_response
from router.apis.responses_request import to_chat
from router.apis.responses_stream import ResponseStream
from router.apis.responses_tools import Unsupported, tool_names
from router.common.errors import invalid
from router.common.parsed import Endpoint, ParsedRequest
from router.common.usage import Usage
from router.openai_api import parse_request
from router.request.json_bounds import check_bounds

# What a response object echoes of its request.
_ECHOED = ("instructions", "max_output_tokens", "metadata", "parallel_tool_calls",
           "temperature", "tool_choice", "tools", "top_p", "user")


class ResponsesTranslation:
    """One Responses request's answer: the engine's chat answer as a response or stream."""

    __slots__ = ("echo", "input_estimate")

    def __init__(self, echo: Echo, input_estimate: int) -> None:
        self.echo, self.input_estimate = echo, input_estimate

    def answer(self, chat: dict[str, Any]) -> bytes:
        return orjson.dumps(to_response(chat, self.echo, self.input_estimate))

    def relay(self, usage: Usage) -> Relay:
        return ResponseStream(self.echo, usage, self.input_estimate)


class ResponsesDialect(Dialect):
    """A Responses request translated to chat completions."""

    name = "responses"

    def __init__(self, refuse_hosted: bool = False) -> None:
        self.refuse_hosted = refuse_hosted

    def parse(self, raw: bytes, endpoint: Endpoint, limits: ServerConfig) -> ParsedRequest:
        body = _body(raw, limits)
        try:
            chat = to_chat(body, self.refuse_hosted)
        except Unsupported as exc:
            err = invalid(exc.message, exc.param)
            model = body.get("model")
            err.model = model if isinstance(model, str) else None
            raise err from None
        parsed = parse_request(orjson.dumps(chat.body), Endpoint.CHAT, limits)
        parsed.raw = raw
        parsed.dropped_tools = ",".join(chat.dropped) or None
        return parsed

    def translation(self, parsed: ParsedRequest, request_id: str) -> ResponsesTranslation:
        body = orjson.loads(parsed.raw)  # the client's (parsed once more: small, once)
        echo = Echo(f"resp_{request_id}", parsed.model, int(time.time()),
                    {k: body[k] for k in _ECHOED if k in body}, tool_names(body.get("tools")))
        return ResponsesTranslation(echo, input_estimate(parsed.raw))


class StatelessPassThrough(Dialect):
    """A Responses request passed through to an engine whose account every tenant shares:
    nothing is stored there, and nothing stored there is read."""

    def parse(self, raw: bytes, endpoint: Endpoint, limits: ServerConfig) -> ParsedRequest:
        parsed = parse_request(raw, endpoint, limits)
        body = parsed.body
        for param in ("previous_response_id", "conversation"):
            if body.get(param) is not None:
                raise invalid(f"'{param}' reads a response stored on the engine, and this "
                              "model's engine is shared by every tenant of the gateway, so "
                              "stored responses are off on this route; send the whole "
                              "conversation in 'input' (the operator may allow them: "
                              "routes.NAME.responses.stored).", param)
        body["store"] = False  # said, not left out: an engine's default may be to store
        return parsed


def input_estimate(raw: bytes) -> int:
    """The gateway's generous estimate of a request's input tokens (from its body's size)."""
    return body_tokens(raw)


def _body(raw: bytes, limits: ServerConfig) -> dict[str, object]:
    breach = check_bounds(raw, limits.max_json_depth, limits.max_json_values)
    if breach is not None:
        raise invalid(breach.message, breach.param)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"Request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise invalid("Request body must be a JSON object.")
    return body


RESPONSES = ResponsesDialect()
RESPONSES_REFUSING = ResponsesDialect(refuse_hosted=True)
RESPONSES_PASSED = StatelessPassThrough()  # the engine speaks it: nothing to translate
RESPONSES_PASSED_STORED = OPENAI  # ...and the route lets it keep responses


def dialect_for(raw: bytes, config: Config) -> Dialect:
    """Passed through when the model's route's primary serves the Responses API, else
    translated; as the route's `responses` section says. A body that cannot be read goes
    to the translation, which says why."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return RESPONSES
    model = body.get("model") if isinstance(body, dict) else None
    route = config.routes.get(model) if isinstance(model, str) else None
    if route is None:
        return RESPONSES
    if Api.RESPONSES in config.backends[route.primary].served_apis:
        return RESPONSES_PASSED_STORED if route.responses.stored else RESPONSES_PASSED
    return (RESPONSES_REFUSING if route.responses.hosted_tools is HostedTools.REFUSE
            else RESPONSES)
