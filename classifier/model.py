"""What the gateway calls: Prediction, the IntentClassifier protocol, the linear model.

LinearIntentClassifier predicts with numpy alone from the committed artifact (arrays and
JSON, no pickle, no fitted scikit-learn object). No network, no logging of prompts.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from classifier.artifact import MODEL_DIR, ArtifactError, FloatArray, read_artifact
from classifier.features import FeatureSettings, featurize
from classifier.labels import DEFAULT_SIMPLE, INTENT_COMPLEXITY


@dataclass(frozen=True, slots=True)
class Prediction:
    intent: str
    confidence: float  # probability of `intent`, the most likely one
    probabilities: dict[str, float]  # every intent, summing to 1

    def p_simple(self, simple_intents: Collection[str] = DEFAULT_SIMPLE) -> float:
        """Probability that the request is simple, for a route's own set of simple intents."""
        return min(1.0, sum(p for i, p in self.probabilities.items() if i in simple_intents))

    @property
    def complexity(self) -> str:
        return INTENT_COMPLEXITY[self.intent]


class IntentClassifier(Protocol):
    def predict(self, text: str) -> Prediction: ...


class LinearIntentClassifier:
    """Hashed features -> one linear layer -> softmax(scores / temperature)."""

    def __init__(
        self,
        weights: FloatArray,
        bias: FloatArray,
        labels: list[str],
        features: FeatureSettings,
        temperature: float = 1.0,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if weights.shape != (features.n_features, len(labels)) or bias.shape != (len(labels),):
            raise ArtifactError("weights, bias and labels do not fit the feature settings")
        unknown = set(labels) - set(INTENT_COMPLEXITY)
        if unknown:
            raise ArtifactError(f"unknown intents in the model: {sorted(unknown)}")
        if not temperature > 0:
            raise ArtifactError(f"temperature must be positive, not {temperature}")
        self.labels = list(labels)
        self.features = features
        self.temperature = float(temperature)
        self.metadata = dict(metadata or {})
        # Folding 1/temperature into the weights saves a division per prediction.
        self._weights = np.ascontiguousarray(weights / np.float32(temperature), np.float32)
        self._bias = (bias / np.float32(temperature)).astype(np.float32)

    @classmethod
    def load(cls, directory: Path | None = None) -> LinearIntentClassifier:
        """The model in `directory`; None means the one committed in classifier/model/."""
        artifact = read_artifact(MODEL_DIR if directory is None else Path(directory))
        meta = artifact.metadata
        try:
            features = FeatureSettings.from_dict(meta["features"])
            return cls(
                artifact.weights,
                artifact.bias,
                meta["labels"],
                features,
                float(meta["temperature"]),
                meta,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"bad classifier metadata: {exc!r}") from exc

    def probabilities(self, text: str) -> FloatArray:
        """Calibrated probabilities in `self.labels` order."""
        index, values = featurize(text, self.features)
        scores = values @ self._weights[index] + self._bias
        scores = np.exp(scores - scores.max())
        result: FloatArray = scores / scores.sum()
        return result

    def predict(self, text: str) -> Prediction:
        probs = self.probabilities(text)
        best = int(probs.argmax())
        return Prediction(
            self.labels[best],
            float(probs[best]),
            dict(zip(self.labels, probs.tolist(), strict=True)),
        )


@functools.cache
def load_default() -> LinearIntentClassifier:
    """The committed model, loaded once per process."""
    return LinearIntentClassifier.load()
