"""Latency of one intent prediction (text -> Prediction) against baselines in the same run.

    .venv/bin/python bench/classifier_latency.py [--rounds N] [--json FILE]

For prompts of 50, 500 and 2,000 characters (English and Chinese, interleaved) it times,
call by call: a dict lookup of len(text) (the floor of any Python call), our featurize
alone, the full predict of the committed model, and scikit-learn's HashingVectorizer
.transform with char 1-4-grams (what the lean path replaces). Target: predict p99 <= 1 ms.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from report import machine  # noqa: E402

from classifier.features import featurize  # noqa: E402
from classifier.model import load_default  # noqa: E402

SIZES = (50, 500, 2000)
EN = (
    "Can you explain why the sky looks blue during the day but red at sunset? "
    "I read something about Rayleigh scattering and wavelengths but did not get it. "
)
ZH = (
    "请帮我分析一下这段代码为什么会出现内存泄漏，并给出修改建议和完整的示例代码。"
    "另外解释一下垃圾回收在这种情况下是怎么工作的，谢谢！"
)


def prompts(size: int) -> list[str]:
    """An English and a Chinese prompt of exactly `size` characters."""
    return [(seed * (size // len(seed) + 1))[:size] for seed in (EN, ZH)]


def time_calls(fn: Callable[[str], object], texts: list[str], rounds: int) -> list[float]:
    """Microseconds of each call, texts alternating, after a short warm-up."""
    for text in texts * 20:
        fn(text)
    out: list[float] = []
    for _ in range(rounds):
        for text in texts:
            started = time.perf_counter_ns()
            fn(text)
            out.append((time.perf_counter_ns() - started) / 1000)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000, help="calls per text and size")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    model = load_default()
    lengths = {n: n for n in SIZES}
    candidates: dict[str, Callable[[str], object]] = {
        "dict[len(text)]": lambda text: lengths.get(len(text)),
        "featurize only": lambda text: featurize(text, model.features),
        "predict (ours)": model.predict,
    }
    try:
        from sklearn.feature_extraction.text import HashingVectorizer

        hashing = HashingVectorizer(analyzer="char", ngram_range=(1, 4), n_features=1 << 18)
        candidates["sklearn HashingVectorizer"] = lambda text: hashing.transform([text])
    except ImportError:
        pass

    result: dict[str, Any] = {"machine": machine(), "rounds": args.rounds, "sizes": {}}
    print(
        f"{'chars':>6}  {'what':<26}{'p50 us':>9}{'p99 us':>9}{'p99 / dict':>12}"
        f"{'p50 vs sklearn':>16}"
    )
    for size in SIZES:
        texts = prompts(size)
        rows = {name: time_calls(fn, texts, args.rounds) for name, fn in candidates.items()}
        floor = percentile(rows["dict[len(text)]"], 99)
        sklearn_p50 = percentile(rows.get("sklearn HashingVectorizer", [float("nan")]), 50)
        result["sizes"][size] = {}
        for name, micros in rows.items():
            p50, p99 = percentile(micros, 50), percentile(micros, 99)
            result["sizes"][size][name] = {"p50_us": round(p50, 1), "p99_us": round(p99, 1)}
            print(
                f"{size:>6}  {name:<26}{p50:>9.1f}{p99:>9.1f}{p99 / floor:>11.0f}x"
                f"{p50 / sklearn_p50:>15.2f}x"
            )
    worst = max(result["sizes"][n]["predict (ours)"]["p99_us"] for n in SIZES)
    verdict = "meets" if worst <= 1000 else "MISSES"
    print(f"\npredict p99 worst case {worst:.0f} us: {verdict} the 1 ms target")
    print(f"load average {machine()['loadavg']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
