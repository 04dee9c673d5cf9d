"""`slotgate classifier train | eval | predict`: the command line of the classifier package.

`router.cli` hands it the arguments after "classifier"; `python -m classifier` works too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from classifier.artifact import MODEL_DIR, ArtifactError
from classifier.dataset import DatasetError, read_examples
from classifier.labels import DEFAULT_MIN_CONFIDENCE
from classifier.model import LinearIntentClassifier


def classifier_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="slotgate classifier")
    add_arguments(parser)
    return _run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`slotgate classifier`'s sub-commands and flags, on `router.cli`'s or our own parser."""
    parser.description = __doc__
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train from classifier/data/ and write the model")
    train.add_argument(
        "--out", type=Path, default=MODEL_DIR, help=f"model directory (default: {MODEL_DIR})"
    )
    evaluate = sub.add_parser("eval", help="score the model on a labelled .jsonl file")
    evaluate.add_argument("file", type=Path, help='lines {"text","intent","complexity","lang"}')
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")
    evaluate.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_MIN_CONFIDENCE,
        help=f"route to the small model when p_simple >= this (default {DEFAULT_MIN_CONFIDENCE})",
    )
    evaluate.add_argument("--model", type=Path, help="model directory (default: committed)")
    predict = sub.add_parser("predict", help="classify texts given as arguments")
    predict.add_argument("texts", nargs="+")
    predict.add_argument("--model", type=Path, help="model directory (default: committed)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.command == "train":
            return _train(args.out)
        model = LinearIntentClassifier.load(args.model)
        if args.command == "eval":
            return _eval(model, args.file, args.threshold, args.json)
        for text in args.texts:
            p = model.predict(text)
            print(f"{p.intent:<17} {p.confidence:.3f}  p_simple={p.p_simple():.3f}  {text!r}")
        return 0
    except (ArtifactError, DatasetError, OSError) as exc:
        print(f"slotgate classifier: {exc}", file=sys.stderr)
        return 1


def _train(out: Path) -> int:
    from classifier.train import train_artifact  # scikit-learn is only needed here

    summary = train_artifact(out)
    calibration = summary["calibration"]
    counts = summary["n_examples"]
    print(
        f"trained on {counts['shared']:,} shared + {counts['team']:,} team examples"
        f" in {summary['seconds']} s"
    )
    print(
        f"temperature {calibration['temperature']:.4f} fitted on {calibration['n']} held-out"
        f" team rows (NLL {calibration['nll_before']:.3f} -> {calibration['nll_after']:.3f},"
        f" intent accuracy {calibration['intent_accuracy']:.3f})"
    )
    print(f"data sha256 {summary['data_sha256']}")
    print(f"wrote {summary['out']}")
    return 0


def _eval(model: LinearIntentClassifier, path: Path, threshold: float, as_json: bool) -> int:
    from classifier.evaluate import evaluate, format_report

    report = evaluate(model, read_examples(path), threshold)
    print(json.dumps(report, ensure_ascii=False) if as_json else format_report(report))
    return 0
