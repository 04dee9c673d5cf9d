"""The Anthropic API's endpoints besides /v1/messages (which `router.dispatch` serves):
`POST /v1/messages/count_tokens` (the gateway's own estimate: no engine is asked) and the
model list in Anthropic's shape, for `GET /v1/models` with an `anthropic-version` header.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from aiohttp import web

from router.apis.anthropic import ANTHROPIC, input_estimate, parse_messages
from router.common.errors import ApiError
from router.gateway import GATEWAY
from router.request.big_body import BIG_BODY
from router.request.body import BodyHold
from router.request.intake import check_content_encoding, check_content_type, read_body


async def count_tokens(request: web.Request) -> web.Response:
    """`{"input_tokens": N}`: the generous estimate admission uses (from the body's size),
    not the model's tokenizer."""
    gw = request.app[GATEWAY]
    server = gw.config.server
    if (refused := gw.guard(request, None, ANTHROPIC)) is not None:
        return refused
    hold = BodyHold(gw.bodies, server.max_inflight_body_bytes, gw.bodies_full)
    big = False
    try:
        check_content_type(request)
        check_content_encoding(request)
        raw = await read_body(request, server.max_body_bytes, server.body_read_timeout_s, hold)
        if len(raw) < BIG_BODY:
            _, chat = parse_messages(raw, server, count_only=True)
        else:  # off the loop (router.request.big_body)
            big = True
            _, chat = await gw.big_bodies.parse(partial(parse_messages, count_only=True),
                                                raw, server)
        if chat["model"] not in gw.config.routes:
            raise ApiError(404, f"model: {chat['model']}", code="model_not_found",
                           param="model")
        return web.json_response({"input_tokens": input_estimate(raw)})
    except ApiError as err:
        return ANTHROPIC.error_response(err, server.retry_after_min_s)
    finally:
        hold.release()
        if big:
            gw.big_bodies.ended()


def model_list(names: list[str]) -> dict[str, Any]:
    """The route names as Anthropic's model list (one page, all of them)."""
    data = [{"type": "model", "id": name, "display_name": name,
             "created_at": "1970-01-01T00:00:00Z"} for name in names]
    return {"data": data, "has_more": False,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}
