"""The intent classifier: features, the committed model, training, eval, CLI (its input text:
tests/test_classifier_text.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from classifier import (
    DEFAULT_SIMPLE,
    INTENT_COMPLEXITY,
    INTENTS,
    LinearIntentClassifier,
    Prediction,
    classifier_main,
    load_default,
)
from classifier.artifact import MODEL_DIR, read_artifact
from classifier.dataset import TEAM_TRAIN, Example, read_examples
from classifier.features import FeatureSettings, featurize

ROOT = Path(__file__).resolve().parents[1]

# --- features ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n\t ",
        "\ud800 lone surrogate",
        "emoji 👩‍💻🙂",
        "\x00\x01\x1b[31m",
        "ｆｕｌｌ－ｗｉｄｔｈ１２３",
        "𠀀𠀁 beyond the BMP",
        "x" * 50_000,
        "混合 mixed 文本 123 ∫x dx ```code```",
    ],
)
def test_featurize_handles_any_text(text: str) -> None:
    settings = FeatureSettings(hash_bits=12)
    index, values = featurize(text, settings)
    assert index.shape == values.shape
    assert index.dtype == np.int64 and values.dtype == np.float32
    assert ((index >= 0) & (index < settings.n_features)).all()
    assert np.isfinite(values).all()


def test_features_ignore_case_width_and_spacing() -> None:
    settings = FeatureSettings()
    a = featurize("Hello   World？", settings)
    b = featurize("hello world?", settings)
    assert np.array_equal(a[0], b[0]) and np.allclose(a[1], b[1])


# --- the committed model ----------------------------------------------------------------

CLEAR = [
    ("hello!", "greeting"),
    ("你好呀", "greeting"),
    ("Translate 'where is the train station' into French", "translate"),
    ("把这句话翻译成英文：今天天气很好", "translate"),
    ("Write a Python function that merges two sorted lists", "code"),
    ("用Java写一个线程安全的单例模式", "code"),
    ("Prove that there are infinitely many prime numbers.", "math"),
    ("证明：对任意正整数n，n^3-n能被6整除", "math"),
]


@pytest.mark.parametrize(("text", "intent"), CLEAR)
def test_committed_model_gets_clear_prompts_right(text: str, intent: str) -> None:
    prediction = load_default().predict(text)
    assert prediction.intent == intent
    simple = INTENT_COMPLEXITY[intent] == "simple"
    assert (prediction.p_simple() >= 0.5) == simple


def test_prediction_is_a_distribution_over_all_intents() -> None:
    prediction = load_default().predict("Summarise this paragraph in one sentence: ...")
    assert set(prediction.probabilities) == set(INTENTS)
    assert sum(prediction.probabilities.values()) == pytest.approx(1.0, abs=1e-5)
    assert prediction.confidence == max(prediction.probabilities.values())
    assert prediction.probabilities[prediction.intent] == prediction.confidence


def test_p_simple_with_an_overridden_simple_set() -> None:
    probabilities = {intent: 0.0 for intent in INTENTS}
    probabilities.update(greeting=0.5, translate=0.2, code=0.3)
    prediction = Prediction("greeting", 0.5, probabilities)
    assert prediction.p_simple() == pytest.approx(0.7)
    assert prediction.p_simple({"greeting"}) == pytest.approx(0.5)
    assert prediction.p_simple({"greeting", "code"}) == pytest.approx(0.8)
    assert prediction.p_simple(set()) == 0.0
    assert prediction.complexity == "simple"
    real = load_default().predict("Write a Python function that merges two sorted lists")
    assert real.p_simple(DEFAULT_SIMPLE | {"code"}) > real.p_simple()


def test_artifact_loads_without_pickle() -> None:
    arrays = sorted(MODEL_DIR.glob("*.npy"))
    assert {p.name for p in arrays} == {"weights.npy", "bias.npy"}
    for path in arrays:
        np.load(path, allow_pickle=False)
    assert not [p for p in MODEL_DIR.iterdir() if p.suffix in (".pkl", ".pickle", ".joblib")]
    metadata = json.loads((MODEL_DIR / "metadata.json").read_text())
    assert metadata["labels"] == sorted(INTENTS)
    for key in ("features", "temperature", "training"):
        assert key in metadata
    assert len(metadata["training"]["data_sha256"]) == 64
    artifact = read_artifact(MODEL_DIR)
    assert artifact.weights.shape[1] == len(INTENTS)
    size = sum(p.stat().st_size for p in MODEL_DIR.iterdir())
    assert size < 5_000_000


# --- training ---------------------------------------------------------------------------


def tiny_training_run(tmp: Path, name: str) -> LinearIntentClassifier:
    """A small model on a sample of the team data: seconds, not minutes."""
    from classifier.train import TrainSettings, train

    team = read_examples(TEAM_TRAIN)[::6]
    settings = TrainSettings(folds=3, calibration_folds=1, features=FeatureSettings(hash_bits=14))
    trained = train(team[::2], team[1::2], settings)
    from classifier.artifact import write_artifact

    write_artifact(tmp / name, trained.weights, trained.bias, trained.metadata())
    return LinearIntentClassifier.load(tmp / name)


def test_training_is_deterministic(tmp_path: Path) -> None:
    first = tiny_training_run(tmp_path, "a")
    second = tiny_training_run(tmp_path, "b")
    for name in ("weights.npy", "bias.npy", "metadata.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    for text, _ in CLEAR:
        assert first.predict(text) == second.predict(text)
    assert first.temperature > 0


def test_predictions_do_not_depend_on_the_process_hash_seed() -> None:
    text = "Explain how a hash map resizes"
    code = (
        "from classifier import load_default; "
        f"print(repr(load_default().predict({text!r}).confidence))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert outputs == {repr(load_default().predict(text).confidence)}


# --- eval and CLI -----------------------------------------------------------------------


def write_rows(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for text, intent, lang in rows:
            row = {
                "text": text,
                "intent": intent,
                "complexity": INTENT_COMPLEXITY[intent],
                "lang": lang,
            }
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def test_eval_json_has_the_documented_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        (text, intent, "zh" if any("\u4e00" <= c <= "\u9fff" for c in text) else "en")
        for text, intent in CLEAR
    ]
    path = write_rows(tmp_path / "small.jsonl", rows)
    assert classifier_main(["eval", str(path), "--json", "--threshold", "0.8"]) == 0
    report = json.loads(capsys.readouterr().out)
    rates = {
        "n",
        "intent_accuracy",
        "simple_vs_complex_accuracy",
        "complex_to_small_rate",
        "simple_kept_rate",
    }
    assert rates <= set(report)
    assert set(report["by_lang"]) == {"en", "zh"}
    for by_lang in report["by_lang"].values():
        assert rates <= set(by_lang)
    assert set(report["latency_ms"]) == {"p50", "p99"}
    assert report["n"] == len(CLEAR)
    assert report["threshold"] == 0.8
    assert 0.0 <= report["complex_to_small_rate"] <= 1.0
    assert report["confusion"]["all"]["simple"]["simple"] >= 0

    assert classifier_main(["eval", str(path)]) == 0
    text = capsys.readouterr().out
    assert "precision" in text and "p99" in text


def test_eval_rates_follow_the_threshold() -> None:
    from classifier.evaluate import evaluate

    class Fixed:
        def __init__(self, p_simple: float) -> None:
            self.p = p_simple

        def predict(self, text: str) -> Prediction:
            probs = {intent: 0.0 for intent in INTENTS}
            probs.update(greeting=self.p, code=1.0 - self.p)
            return Prediction(
                "greeting" if self.p >= 0.5 else "code", max(self.p, 1 - self.p), probs
            )

    examples = [Example("a", "greeting", "en"), Example("b", "code", "en")]
    sure = evaluate(Fixed(0.9), examples, threshold=0.8)
    assert sure["complex_to_small_rate"] == 1.0 and sure["simple_kept_rate"] == 0.0
    unsure = evaluate(Fixed(0.7), examples, threshold=0.8)
    assert unsure["complex_to_small_rate"] == 0.0 and unsure["simple_kept_rate"] == 1.0
    assert unsure["simple_vs_complex_accuracy"] == 0.5
    assert unsure["intent_accuracy"] == 0.5


def test_cli_reports_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x", "intent": "nope"}\n')
    assert classifier_main(["eval", str(bad)]) == 1
    assert classifier_main(["eval", str(tmp_path / "missing.jsonl")]) == 1
    assert classifier_main(["eval", str(bad), "--model", str(tmp_path)]) == 1
    assert "slotgate classifier:" in capsys.readouterr().err
    assert classifier_main(["predict", "hello there"]) == 0
    assert "greeting" in capsys.readouterr().out


# --- dependencies -----------------------------------------------------------------------


def test_importing_and_predicting_pulls_in_no_gateway_or_sklearn_modules() -> None:
    code = (
        "import sys, classifier, classifier.cli, classifier.evaluate\n"
        "classifier.load_default().predict(classifier.request_text("
        "{'messages': [{'role': 'user', 'content': 'hi'}]}))\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('aiohttp', 'yaml', 'router', 'policies', 'sklearn', 'scipy')]\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
