"""Fit the linear model on the shipped data, calibrate it, and write the artifact.

Deterministic: fixed folds (by text hash), fixed solver seed, same data -> same weights.
The only module that imports scikit-learn/scipy; prediction never needs them.
"""

from __future__ import annotations

import hashlib
import platform
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import scipy.sparse as sparse  # type: ignore[import-untyped]
import sklearn
from sklearn.svm import LinearSVC

from classifier.artifact import write_artifact
from classifier.dataset import SHARED_TRAIN, TEAM_TRAIN, Example, files_sha256, read_examples
from classifier.features import FeatureSettings, featurize
from classifier.model import LinearIntentClassifier

Scores = npt.NDArray[np.float64]
Labels = npt.NDArray[np.int64]


@dataclass(frozen=True)
class TrainSettings:
    """Chosen by cross-validation on slotgate_train and the shared dev split (never heldout)."""

    c: float = 0.01  # LinearSVC's C for a shared row: small, the templated sources mislead
    team_weight: float = 500.0  # a natural team-written row weighs this many shared rows
    class_balance: bool = True  # thin intents (explain, brainstorm) are not drowned
    folds: int = 5  # team rows split into this many folds, stratified by (intent, lang)
    calibration_folds: int = 1  # folds held out, one fit each, to fit the temperature on
    seed: int = 0
    features: FeatureSettings = field(default_factory=FeatureSettings)


@dataclass(frozen=True)
class Calibration:
    temperature: float
    n: int  # held-out team rows the temperature was fitted on
    nll_before: float  # mean negative log-likelihood at temperature 1
    nll_after: float
    intent_accuracy: float  # of the fold models on their held-out rows


@dataclass(frozen=True)
class TrainedModel:
    weights: npt.NDArray[np.float32]  # (n_features, n_labels), already rounded to float16
    bias: npt.NDArray[np.float32]
    labels: list[str]
    features: FeatureSettings
    calibration: Calibration

    def metadata(self) -> dict[str, Any]:
        return {
            "labels": self.labels,
            "features": self.features.to_dict(),
            "temperature": self.calibration.temperature,
        }

    def classifier(self) -> LinearIntentClassifier:
        return LinearIntentClassifier(
            self.weights,
            self.bias,
            self.labels,
            self.features,
            self.calibration.temperature,
            self.metadata(),
        )


def train(
    shared: Sequence[Example], team: Sequence[Example], settings: TrainSettings
) -> TrainedModel:
    """Fit on shared + team rows; the temperature comes from team folds held out."""
    labels = sorted({e.intent for e in (*shared, *team)})
    index = {label: i for i, label in enumerate(labels)}
    x = feature_matrix([e.text for e in (*shared, *team)], settings.features)
    y = np.array([index[e.intent] for e in (*shared, *team)], dtype=np.int64)
    weight = np.concatenate((np.ones(len(shared)), np.full(len(team), settings.team_weight)))
    is_team = np.arange(len(y)) >= len(shared)
    fold = np.full(len(y), -1)
    fold[is_team] = fold_numbers(team, settings.folds)

    held_scores: list[Scores] = []
    held_y: list[Labels] = []
    for k in range(min(settings.calibration_folds, settings.folds)):
        keep = fold != k
        coef, bias = _fit(x[keep], y[keep], weight[keep], len(labels), settings)
        held_scores.append(_scores(x[~keep], coef, bias))
        held_y.append(y[~keep])
    calibration = _calibrate(held_scores, held_y)

    coef, bias = _fit(x, y, weight, len(labels), settings)
    # The artifact stores float16: round here so the model in hand predicts like the file.
    weights = coef.T.astype(np.float16).astype(np.float32)
    return TrainedModel(weights, bias.astype(np.float32), labels, settings.features, calibration)


def feature_matrix(texts: Sequence[str], features: FeatureSettings) -> Any:
    """CSR matrix of `featurize` rows: the very function prediction uses."""
    rows = [featurize(text, features) for text in texts]
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([r[0].size for r in rows], out=indptr[1:])
    indices = np.concatenate([r[0] for r in rows]) if rows else np.zeros(0, np.int64)
    values = np.concatenate([r[1] for r in rows]) if rows else np.zeros(0, np.float32)
    matrix = sparse.csr_matrix((values, indices, indptr), (len(rows), features.n_features))
    matrix.sum_duplicates()
    return matrix


def fold_numbers(examples: Sequence[Example], folds: int) -> Labels:
    """Fold of each example: within each (intent, lang), deal rows ordered by text hash."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, e in enumerate(examples):
        groups.setdefault((e.intent, e.lang), []).append(i)
    out = np.zeros(len(examples), dtype=np.int64)
    for members in groups.values():
        members.sort(key=lambda i: hashlib.sha256(examples[i].text.encode()).digest())
        for rank, i in enumerate(members):
            out[i] = rank % folds
    return out


def fit_temperature(scores: Scores, y: Labels) -> float:
    """The T minimising the mean NLL of softmax(scores / T): log-grid, then golden section."""
    if y.size == 0:
        return 1.0
    grid = np.exp(np.linspace(np.log(0.01), np.log(100.0), 93))
    best = int(np.argmin([_nll(scores, y, t) for t in grid]))
    lo, hi = np.log(grid[max(best - 1, 0)]), np.log(grid[min(best + 1, grid.size - 1)])
    ratio = (np.sqrt(5.0) - 1.0) / 2.0
    for _ in range(40):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if _nll(scores, y, float(np.exp(a))) <= _nll(scores, y, float(np.exp(b))):
            hi = b
        else:
            lo = a
    return float(np.exp((lo + hi) / 2.0))


def train_artifact(out: Path, settings: TrainSettings | None = None) -> dict[str, Any]:
    """Train from the data shipped in classifier/data/ and write the model to `out`."""
    settings = settings or TrainSettings()
    started = time.perf_counter()
    files = [SHARED_TRAIN, TEAM_TRAIN]
    shared, team = read_examples(SHARED_TRAIN), read_examples(TEAM_TRAIN)
    model = train(shared, team, settings)
    seconds = time.perf_counter() - started
    training = {
        "data_files": [p.name for p in files],
        "data_sha256": files_sha256(files),
        "n_examples": {"shared": len(shared), "team": len(team)},
        "estimator": "sklearn.svm.LinearSVC (one-vs-rest) + softmax temperature scaling",
        "settings": {k: v for k, v in asdict(settings).items() if k != "features"},
        "calibration": asdict(model.calibration),
        "sklearn_version": sklearn.__version__,
        "numpy_version": np.__version__,
        "python_version": platform.python_version(),
    }
    write_artifact(out, model.weights, model.bias, {**model.metadata(), "training": training})
    return {**training, "seconds": round(seconds, 1), "out": str(out)}


def _fit(
    x: Any, y: Labels, weight: npt.NDArray[np.float64], n_labels: int, settings: TrainSettings
) -> tuple[Scores, Scores]:
    svm = LinearSVC(
        C=settings.c,
        class_weight="balanced" if settings.class_balance else None,
        random_state=settings.seed,
        max_iter=2000,
    )
    svm.fit(x, y, sample_weight=weight)
    coef = np.zeros((n_labels, x.shape[1]))
    bias = np.full(n_labels, -1e3)  # a label absent from this fit never wins
    if len(svm.classes_) == 2:  # sklearn keeps one row for two classes
        coef[svm.classes_] = np.vstack((-svm.coef_[0], svm.coef_[0]))
        bias[svm.classes_] = [-svm.intercept_[0], svm.intercept_[0]]
    else:
        coef[svm.classes_] = svm.coef_
        bias[svm.classes_] = svm.intercept_
    return coef, bias


def _scores(x: Any, coef: Scores, bias: Scores) -> Scores:
    result: Scores = np.asarray(x @ coef.T) + bias
    return result


def _calibrate(held_scores: list[Scores], held_y: list[Labels]) -> Calibration:
    if not held_scores:
        return Calibration(1.0, 0, 0.0, 0.0, 0.0)
    scores, y = np.vstack(held_scores), np.concatenate(held_y)
    temperature = fit_temperature(scores, y)
    accuracy = float((scores.argmax(axis=1) == y).mean()) if y.size else 0.0
    return Calibration(
        round(temperature, 6),
        int(y.size),
        round(_nll(scores, y, 1.0), 6),
        round(_nll(scores, y, temperature), 6),
        round(accuracy, 6),
    )


def _nll(scores: Scores, y: Labels, temperature: float) -> float:
    z = scores / temperature
    z = z - z.max(axis=1, keepdims=True)
    log_p = z[np.arange(y.size), y] - np.log(np.exp(z).sum(axis=1))
    return float(-log_p.mean())
