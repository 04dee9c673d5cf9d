"""What the gateway checks of a /v1/embeddings body; everything else passes through.

`input` is one text, a list of texts, one token-id list or a list of token-id lists, sent
upstream as one request (an engine batches it itself); `encoding_format` is float or
base64; `dimensions` a positive integer; `user` a string; there is no streaming. A problem
comes back as (message, param), for the caller to answer 400 with (no import of it here).
"""

from __future__ import annotations

from typing import Any

Problem = tuple[str, str]

ENCODINGS = frozenset({"float", "base64"})


def embeddings_problem(body: dict[str, Any], max_inputs: int) -> Problem | None:
    """The first thing wrong with an embeddings request's fields, or None."""
    if "stream" in body:
        return ("'stream' is not accepted on /v1/embeddings: embeddings are not "
                "streamed.", "stream")
    problem = _input_problem(body.get("input"), max_inputs)
    if problem is not None:
        return problem
    encoding = body.get("encoding_format")
    if encoding is not None and not (isinstance(encoding, str) and encoding in ENCODINGS):
        return ("'encoding_format' must be 'float' or 'base64'.", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
        return ("'dimensions' must be a positive integer.", "dimensions")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        return ("'user' must be a string.", "user")
    return None


def _input_problem(value: object, max_inputs: int) -> Problem | None:
    shape = ("'input' is required: a string, an array of strings, an array of token ids "
             "or an array of token-id arrays, none empty.", "input")
    if isinstance(value, str):
        return None if value else shape
    if not isinstance(value, list) or not value:
        return shape
    kinds = set(map(type, value))  # C speed, even for a long token list
    if kinds == {int}:
        return None if min(value) >= 0 else ("'input' token ids must not be negative.",
                                             "input")
    if len(value) > max_inputs:
        return (f"'input' holds {len(value)} items; the limit is {max_inputs} "
                "(server.max_embedding_inputs).", "input")
    if kinds == {str}:
        return None if all(value) else shape
    if kinds == {list}:
        for tokens in value:
            if not tokens or set(map(type, tokens)) != {int} or min(tokens) < 0:
                return shape
        return None
    return shape


def input_text(value: object) -> str:
    """The texts of `input`, joined (token ids are not text: none), for a token estimate
    when the engine reports no usage."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(v for v in value if isinstance(v, str))
    return ""
