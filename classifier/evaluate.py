"""Score a classifier on labelled prompts: per-intent precision/recall, routing rates, latency.

A prompt is routed to the small model when p_simple >= threshold; "simple vs complex"
accuracy judges p_simple >= 0.5. Pure computation plus a timer; printing is the CLI's job.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from classifier.dataset import Example
from classifier.labels import DEFAULT_MIN_CONFIDENCE, DEFAULT_SIMPLE, INTENTS, Complexity
from classifier.model import IntentClassifier, Prediction

SIMPLE, COMPLEX = Complexity.SIMPLE.value, Complexity.COMPLEX.value


def evaluate(
    classifier: IntentClassifier,
    examples: Sequence[Example],
    threshold: float = DEFAULT_MIN_CONFIDENCE,
    simple_intents: Collection[str] = DEFAULT_SIMPLE,
) -> dict[str, Any]:
    """The report as plain JSON-ready data (see the module docstring for the rules)."""
    for e in examples[:20]:  # warm caches so the latency figures show the steady state
        classifier.predict(e.text)
    predictions: list[Prediction] = []
    nanos: list[int] = []
    for e in examples:
        started = time.perf_counter_ns()
        predictions.append(classifier.predict(e.text))
        nanos.append(time.perf_counter_ns() - started)
    p_simple = [p.p_simple(simple_intents) for p in predictions]
    langs = sorted({e.lang for e in examples})
    report: dict[str, Any] = {
        "threshold": threshold,
        **_rates(examples, predictions, p_simple, threshold),
        "by_lang": {
            lang: _rates(*_only(lang, examples, predictions, p_simple), threshold) for lang in langs
        },
        "per_intent": _per_intent(examples, predictions),
        "confusion": {
            lang: _confusion(*_only(lang, examples, predictions, p_simple))
            for lang in [*langs, "all"]
        },
        "latency_ms": _latency(nanos),
    }
    return report


def format_report(report: dict[str, Any]) -> str:
    """The report as aligned text for a terminal."""
    lines = [f"{'intent':<18}{'precision':>10}{'recall':>8}{'support':>9}"]
    for intent, row in report["per_intent"].items():
        lines.append(
            f"{intent:<18}{row['precision']:>10.3f}{row['recall']:>8.3f}{row['support']:>9}"
        )
    lines.append("")
    lines.append("simple vs complex (true rows x predicted columns, p_simple >= 0.5):")
    for lang, matrix in report["confusion"].items():
        lines.append(f"  {lang:<4} {'':<8}{SIMPLE:>8}{COMPLEX:>8}")
        for truth in (SIMPLE, COMPLEX):
            row = matrix[truth]
            lines.append(f"  {'':<4} {truth:<8}{row[SIMPLE]:>8}{row[COMPLEX]:>8}")
    lines.append("")
    lines.append(f"routing threshold p_simple >= {report['threshold']}")
    header = f"  {'':<5}{'n':>6}{'intent':>8}{'s/c acc':>9}{'c->small':>10}{'s kept':>8}"
    lines.append(header)
    for name, rates in [*report["by_lang"].items(), ("all", report)]:
        lines.append(
            f"  {name:<5}{rates['n']:>6}{rates['intent_accuracy']:>8.3f}"
            f"{rates['simple_vs_complex_accuracy']:>9.3f}"
            f"{rates['complex_to_small_rate']:>10.3f}{rates['simple_kept_rate']:>8.3f}"
        )
    latency = report["latency_ms"]
    lines.append("")
    lines.append(
        f"latency of one predict: p50 {latency['p50']:.3f} ms, p99 {latency['p99']:.3f} ms"
    )
    return "\n".join(lines)


def _only(
    lang: str,
    examples: Sequence[Example],
    predictions: Sequence[Prediction],
    p_simple: Sequence[float],
) -> tuple[list[Example], list[Prediction], list[float]]:
    keep = [i for i, e in enumerate(examples) if lang in ("all", e.lang)]
    return (
        [examples[i] for i in keep],
        [predictions[i] for i in keep],
        [p_simple[i] for i in keep],
    )


def _rates(
    examples: Sequence[Example],
    predictions: Sequence[Prediction],
    p_simple: Sequence[float],
    threshold: float,
) -> dict[str, Any]:
    simple = [e.complexity == SIMPLE for e in examples]
    n_simple = sum(simple)
    n_complex = len(examples) - n_simple
    to_small = sum(1 for s, p in zip(simple, p_simple, strict=True) if not s and p >= threshold)
    kept = sum(1 for s, p in zip(simple, p_simple, strict=True) if s and p < threshold)
    right = sum(1 for s, p in zip(simple, p_simple, strict=True) if s == (p >= 0.5))
    hits = sum(1 for e, p in zip(examples, predictions, strict=True) if e.intent == p.intent)
    return {
        "n": len(examples),
        "intent_accuracy": _share(hits, len(examples)),
        "simple_vs_complex_accuracy": _share(right, len(examples)),
        "complex_to_small_rate": _share(to_small, n_complex),
        "simple_kept_rate": _share(kept, n_simple),
    }


def _per_intent(
    examples: Sequence[Example], predictions: Sequence[Prediction]
) -> dict[str, dict[str, Any]]:
    seen = {e.intent for e in examples} | {p.intent for p in predictions}
    out: dict[str, dict[str, Any]] = {}
    for intent in [i for i in INTENTS if i in seen]:
        truth = [e.intent == intent for e in examples]
        guess = [p.intent == intent for p in predictions]
        both = sum(1 for t, g in zip(truth, guess, strict=True) if t and g)
        out[intent] = {
            "precision": _share(both, sum(guess)),
            "recall": _share(both, sum(truth)),
            "support": sum(truth),
        }
    return out


def _confusion(
    examples: Sequence[Example], predictions: Sequence[Prediction], p_simple: Sequence[float]
) -> dict[str, dict[str, int]]:
    matrix = {truth: {SIMPLE: 0, COMPLEX: 0} for truth in (SIMPLE, COMPLEX)}
    for e, p in zip(examples, p_simple, strict=True):
        matrix[e.complexity][SIMPLE if p >= 0.5 else COMPLEX] += 1
    return matrix


def _latency(nanos: Sequence[int]) -> dict[str, float]:
    if not nanos:
        return {"p50": 0.0, "p99": 0.0}
    ms = np.asarray(nanos, dtype=np.float64) / 1e6
    return {
        "p50": round(float(np.percentile(ms, 50)), 4),
        "p99": round(float(np.percentile(ms, 99)), 4),
    }


def _share(part: int, whole: int) -> float:
    return round(part / whole, 4) if whole else 0.0
