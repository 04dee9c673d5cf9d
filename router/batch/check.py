"""A batch's input checked at its creation, as the live endpoint would check each request:
the line's `url` is the batch's endpoint, every line names the same model (as OpenAI
requires), a model the gateway routes, no stream, and the body passes the endpoint's own
parser. The first bad line is named in a 400. Runs on a worker thread (no I/O but the
file's read)."""

from __future__ import annotations

from pathlib import Path

import orjson

from policies.config import ServerConfig
from router.common.errors import ApiError
from router.common.parsed import Endpoint
from router.openai_api import parse_request

ENDPOINTS = {"/v1/chat/completions": Endpoint.CHAT, "/v1/embeddings": Endpoint.EMBEDDINGS,
             "/v1/responses": Endpoint.RESPONSES, "/v1/completions": Endpoint.COMPLETIONS}


def _bad(number: int, message: str) -> ApiError:
    return ApiError(400, f"Line {number} of the input file: {message}",
                    code="invalid_batch_input", param="input_file_id")


def checked_lines(path: Path, url: str, routes: frozenset[str], server: ServerConfig
                  ) -> tuple[str, list[tuple[int, str, bytes]]]:
    """(the batch's model, [(line number, custom_id, body)]) of an input file whose lines
    the Files API has checked for shape already."""
    endpoint = ENDPOINTS[url]
    model: str | None = None
    lines: list[tuple[int, str, bytes]] = []
    with path.open("rb") as text:
        for number, line in enumerate(text, start=1):
            if not line.strip():
                continue
            request = orjson.loads(line)
            if request["url"] != url:
                raise _bad(number, f"its url {request['url']!r} is not the batch's {url!r}.")
            body = request["body"]
            if body.get("stream"):
                raise _bad(number, "'stream' is not available in a batch.")
            raw = orjson.dumps(body)
            try:
                parsed = parse_request(raw, endpoint, server)
            except ApiError as err:
                raise _bad(number, err.message) from None
            if model is None:
                model = parsed.model
            elif parsed.model != model:
                raise _bad(number, f"its model {parsed.model!r} differs from the first "
                           f"line's {model!r}; a batch has one model.")
            if parsed.model not in routes:
                raise _bad(number, f"the model {parsed.model!r} does not exist.")
            lines.append((number, request["custom_id"], raw))
    assert model is not None  # the Files API refuses a file without requests
    return model, lines
