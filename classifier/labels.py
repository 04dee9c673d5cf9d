"""The 14 intents, their simple/complex split and the default routing threshold.

Pure constants: no I/O, no numpy.
"""

from __future__ import annotations

import enum
from typing import Final


class Complexity(enum.StrEnum):
    SIMPLE = "simple"
    COMPLEX = "complex"


INTENT_COMPLEXITY: Final[dict[str, str]] = {
    "greeting": Complexity.SIMPLE.value,
    "chitchat": Complexity.SIMPLE.value,
    "rewrite": Complexity.SIMPLE.value,
    "translate": Complexity.SIMPLE.value,
    "summarize": Complexity.SIMPLE.value,
    "extract": Complexity.SIMPLE.value,
    "classify": Complexity.SIMPLE.value,
    "simple_qa": Complexity.SIMPLE.value,
    "brainstorm": Complexity.SIMPLE.value,
    "explain": Complexity.COMPLEX.value,
    "creative_writing": Complexity.COMPLEX.value,
    "math": Complexity.COMPLEX.value,
    "code": Complexity.COMPLEX.value,
    "reasoning": Complexity.COMPLEX.value,
}

INTENTS: Final[tuple[str, ...]] = tuple(INTENT_COMPLEXITY)

# Which intents may go to the small model unless a route's config says otherwise.
DEFAULT_SIMPLE: Final[frozenset[str]] = frozenset(
    intent for intent, level in INTENT_COMPLEXITY.items() if level == Complexity.SIMPLE
)

# A waiting request moves to the small model when p_simple >= this (the route's
# `min_confidence` default).
DEFAULT_MIN_CONFIDENCE: Final[float] = 0.8
