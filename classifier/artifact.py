"""The trained model on disk: weights.npy, bias.npy and metadata.json, no pickle.

Reading checks shapes and the format version; arrays are loaded with allow_pickle=False.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

MODEL_DIR: Final = Path(__file__).resolve().parent / "model"
WEIGHTS: Final = "weights.npy"  # (n_features, n_labels), float16
BIAS: Final = "bias.npy"  # (n_labels,), float32
METADATA: Final = "metadata.json"
FORMAT: Final = 1

FloatArray = npt.NDArray[np.float32]


class ArtifactError(ValueError):
    """A model directory that is missing a file or does not fit together."""


@dataclass(frozen=True)
class Artifact:
    weights: FloatArray
    bias: FloatArray
    metadata: dict[str, Any]


def write_artifact(
    directory: Path, weights: FloatArray, bias: FloatArray, metadata: dict[str, Any]
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    np.save(directory / WEIGHTS, weights.astype(np.float16), allow_pickle=False)
    np.save(directory / BIAS, bias.astype(np.float32), allow_pickle=False)
    text = json.dumps({"format": FORMAT, **metadata}, indent=2, ensure_ascii=False)
    (directory / METADATA).write_text(text + "\n", encoding="utf-8")


def read_artifact(directory: Path) -> Artifact:
    try:
        metadata = json.loads((directory / METADATA).read_text(encoding="utf-8"))
        weights = np.load(directory / WEIGHTS, allow_pickle=False)
        bias = np.load(directory / BIAS, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"cannot read the classifier model in {directory}: {exc}") from exc
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise ArtifactError(f"{directory / METADATA}: not a format-{FORMAT} classifier model")
    labels = metadata.get("labels")
    if (
        not isinstance(labels, list)
        or weights.ndim != 2
        or bias.shape != (len(labels),)
        or weights.shape[1] != len(labels)
    ):
        raise ArtifactError(f"{directory}: weights, bias and labels do not fit together")
    return Artifact(weights.astype(np.float32), bias.astype(np.float32), metadata)
