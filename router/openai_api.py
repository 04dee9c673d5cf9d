"""Parse and validate an OpenAI request's body into a `ParsedRequest` (router.common.parsed);
what is wrong is a 400 `ApiError` (router.common.errors). The body is read and its size,
type and coding checked before (router.request.intake).

Only what the gateway itself needs is validated; every other field passes through.
"""

from __future__ import annotations

import gc
from typing import Any

import orjson

from policies.config import ServerConfig
from router.common.errors import invalid
from router.common.parsed import Endpoint, ParsedRequest
from router.request.embeddings import embeddings_problem
from router.request.json_bounds import check_bounds

# Fields some SDKs and proxies read as "send this elsewhere" or "use these credentials":
# the gateway alone decides where a request goes and with which key.
DESTINATION_FIELDS = frozenset({
    "api_base", "base_url", "api_key", "api_version", "api_type", "organization",
    "custom_llm_provider", "deployment_id", "extra_headers", "proxy", "endpoint",
})


_DEFAULTS = ServerConfig()
_PAUSE_GC_FROM = 64 * 1024  # bytes of body from which parsing pauses the cyclic GC


def parse_request(raw: bytes, endpoint: Endpoint,
                  limits: ServerConfig = _DEFAULTS) -> ParsedRequest:
    """The request in `raw`, within the body limits of `limits` (the `server` settings)."""
    breach = check_bounds(raw, limits.max_json_depth, limits.max_json_values)
    if breach is not None:  # before parsing: orjson must neither work for it nor change it
        raise invalid(breach.message, breach.param)
    try:
        body = orjson.loads(raw) if len(raw) < _PAUSE_GC_FROM else _loads_without_gc(raw)
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

    if endpoint is Endpoint.EMBEDDINGS:
        if (problem := embeddings_problem(body, limits.max_embedding_inputs)) is not None:
            raise invalid(*problem)
        return ParsedRequest(endpoint, body, model, False, False, None, raw)
    if endpoint is Endpoint.RESPONSES:  # passed through: the engine checks the rest
        return _responses_request(body, model, raw)
    if endpoint is Endpoint.CHAT:
        _check_messages(body.get("messages"), limits.max_messages)
        prompts = 1
    else:
        prompts = _count_prompts(body.get("prompt"), limits.max_sequences)
    _check_sequences(body, prompts, limits.max_sequences)
    stream = False if (given := body.get("stream")) is None else given
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


def _responses_request(body: dict[str, Any], model: str, raw: bytes) -> ParsedRequest:
    """A Responses request passed through as it is (nothing added: it asks no stream
    usage option, its final event carries the usage)."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise invalid("'stream' must be a boolean.", "stream")
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or limit < 1):
        raise invalid("'max_output_tokens' must be a positive integer.", "max_output_tokens")
    ours = body.get("slotgate")
    if ours is not None and not isinstance(ours, dict):
        raise invalid("'slotgate' must be an object.", "slotgate")
    return ParsedRequest(Endpoint.RESPONSES, body, model, stream is True, True, limit, raw,
                         isinstance(ours, dict) and ours.get("queue_events") is True)


def _loads_without_gc(raw: bytes) -> Any:
    """orjson.loads with the cyclic GC paused: parsing makes no cycles, and the collections
    that thousands of new lists and dicts would set off cost more than the parse itself
    (two thirds of the time for 262,144 small arrays)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return orjson.loads(raw)
    finally:
        if paused:
            gc.enable()


def _check_messages(messages: object, limit: int) -> None:
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' is required and must be a non-empty array.", "messages")
    if len(messages) > limit:
        raise invalid(f"'messages' holds {len(messages)} messages; the limit is {limit}.",
                      "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise invalid(f"'messages[{i}]' must be an object with a string 'role'.", "messages")


def _count_prompts(prompt: object, cap: int) -> int:
    """How many prompts `prompt` holds: a string or an array of token ids is one; any
    other array holds one per item (the engine checks the details)."""
    if isinstance(prompt, str):
        return 1
    if not isinstance(prompt, list) or not prompt:
        raise invalid("'prompt' is required: a string or a non-empty array.", "prompt")
    if len(prompt) <= cap:
        return len(prompt)  # within the cap whatever it holds: no need to look inside
    if set(map(type, prompt)) == {int}:  # C speed, even for a long token array
        return 1
    return len(prompt)


def _check_sequences(body: dict[str, Any], prompts: int, cap: int) -> None:
    """One slot is one sequence at the engine: `n` and `best_of` multiply the sequences
    each prompt generates, so a request asking for more than `cap` is refused."""
    each = 1
    param = "prompt"
    for name in ("n", "best_of"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise invalid(f"'{name}' must be a positive integer.", name)
        if value > each:
            each, param = value, name
    asked = each * prompts
    if asked <= cap:
        return
    parts = [f"{param}={each}"] if each > 1 else []
    if prompts > 1:
        parts.append(f"{prompts} prompts")
        param = param if each > 1 else "prompt"
    raise invalid(f"This request asks for {asked} sequences ({' x '.join(parts)}); the "
                  f"gateway allows {cap} per request (server.max_sequences), one slot each.",
                  param)
