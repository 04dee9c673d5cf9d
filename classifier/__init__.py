"""Intent classifier: which waiting requests are simple enough for the small model.

Numpy-only prediction from a committed artifact; scikit-learn is needed to train only.
Never imports aiohttp, yaml or `router`.
"""

from classifier.labels import (
    DEFAULT_MIN_CONFIDENCE,
    DEFAULT_SIMPLE,
    INTENT_COMPLEXITY,
    INTENTS,
    Complexity,
)
from classifier.model import (
    IntentClassifier,
    LinearIntentClassifier,
    Prediction,
    load_default,
)
from classifier.text import request_text


def classifier_main(argv: list[str]) -> int:
    """`slotgate classifier train | eval | predict` (imports the CLI lazily)."""
    from classifier.cli import classifier_main as main

    return main(argv)


__all__ = [
    "DEFAULT_MIN_CONFIDENCE",
    "DEFAULT_SIMPLE",
    "INTENTS",
    "INTENT_COMPLEXITY",
    "Complexity",
    "IntentClassifier",
    "LinearIntentClassifier",
    "Prediction",
    "classifier_main",
    "load_default",
    "request_text",
]
