"""A request as the gateway knows it once parsed: the endpoint it came on (`Endpoint`) and
what the gateway itself reads of its body (`ParsedRequest`). Plain data: parsing and
validation are `router.openai_api`'s, and other client APIs translate to the same form."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from policies.apis import Api


class Endpoint(enum.StrEnum):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    MESSAGES = "/v1/messages"  # Anthropic's, translated to chat (router.apis.anthropic)
    EMBEDDINGS = "/v1/embeddings"
    RESPONSES = "/v1/responses"  # passed through, or translated to chat (router.apis.responses)

    # The client API this endpoint serves (a metric label, a ledger column): a plain
    # attribute of each member, set below (a property would cost two calls per read:
    # itself and the member's hash).
    api: Api


for _endpoint, _api in ((Endpoint.CHAT, Api.CHAT), (Endpoint.COMPLETIONS, Api.COMPLETIONS),
                        (Endpoint.EMBEDDINGS, Api.EMBEDDINGS), (Endpoint.MESSAGES, Api.MESSAGES),
                        (Endpoint.RESPONSES, Api.RESPONSES)):
    _endpoint.api = _api


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
    dropped_tools: str | None = None  # tools a translation left out (comma-separated types)
