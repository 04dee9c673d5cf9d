"""The simulated engine's embeddings: each input's vector made from a hash of it, so that
the same input always gets the same unit vector, at the dimensions asked for.

Pure: no I/O, no clock. The engine (`engine.py`) gives the batch its slot and its latency.
"""

from __future__ import annotations

import base64
import hashlib
import math
from array import array
from dataclasses import dataclass

DEFAULT_DIMENSIONS = 384  # as BAAI/bge-small-en-v1.5
MAX_DIMENSIONS = 8192

Item = str | tuple[int, ...]  # a text, or token ids


@dataclass(frozen=True, slots=True)
class EmbedPlan:
    """What an embeddings request asks: its inputs, their size, the vectors' shape."""

    items: tuple[Item, ...]
    dimensions: int
    base64: bool

    @property
    def tokens(self) -> int:
        """Its prompt tokens: a token list's length, about four characters a token of text."""
        return sum(len(i) if isinstance(i, tuple) else max(1, len(i) // 4) for i in self.items)


def embed_plan(body: dict[str, object]) -> EmbedPlan:
    """An embeddings body's plan; ValueError (the engine's 400) for what it cannot embed."""
    value = body.get("input")
    items: list[Item]
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, list) and value and all(type(v) is int for v in value):
        items = [tuple(value)]
    elif isinstance(value, list) and value:
        items = [v if isinstance(v, str) else _tokens(v) for v in value]
    else:
        raise ValueError("'input' must be a string, a list of strings or token ids")
    dimensions = body.get("dimensions", DEFAULT_DIMENSIONS)
    if type(dimensions) is not int or not 1 <= dimensions <= MAX_DIMENSIONS:
        raise ValueError(f"'dimensions' must be an integer from 1 to {MAX_DIMENSIONS}")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise ValueError("'encoding_format' must be 'float' or 'base64'")
    return EmbedPlan(tuple(items), dimensions, encoding == "base64")


def _tokens(value: object) -> tuple[int, ...]:
    if isinstance(value, list) and value and all(type(v) is int for v in value):
        return tuple(value)
    raise ValueError("each item of 'input' must be a string or a list of token ids")


def vector(item: Item, dimensions: int) -> list[float]:
    """`item`'s unit vector: SHAKE-256 of it read as signed 16-bit components."""
    seed = item.encode() if isinstance(item, str) else array("q", item).tobytes() + b"#"
    raw = array("h", hashlib.shake_256(seed).digest(2 * dimensions))
    norm = math.sqrt(sum(c * c for c in raw)) or 1.0
    return [c / norm for c in raw]


def answer(plan: EmbedPlan, model: str) -> dict[str, object]:
    """The OpenAI embeddings answer: one object per input, in order, and the usage."""
    data = []
    for index, item in enumerate(plan.items):
        values = vector(item, plan.dimensions)
        embedding: object = (base64.b64encode(array("f", values).tobytes()).decode()
                             if plan.base64 else values)
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = plan.tokens
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
