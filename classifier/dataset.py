"""Labelled prompts: the files shipped in classifier/data/ and how to read them.

Lines are {"text", "intent", "complexity", "lang"[, "source"]}; .gz files are read as gzip.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from classifier.labels import INTENT_COMPLEXITY

DATA_DIR: Final = Path(__file__).resolve().parent / "data"
SHARED_TRAIN: Final = DATA_DIR / "intents_train.jsonl.gz"
SHARED_DEV: Final = DATA_DIR / "intents_dev.jsonl.gz"
TEAM_TRAIN: Final = DATA_DIR / "slotgate_train.jsonl"
HELDOUT: Final = DATA_DIR / "heldout_natural.jsonl"  # evaluation only: never fit on it


class DatasetError(ValueError):
    """A data file line that is not a labelled prompt."""


@dataclass(frozen=True)
class Example:
    text: str
    intent: str
    lang: str = ""
    source: str = ""
    complexity: str = ""  # "" means the intent's own (INTENT_COMPLEXITY)

    def __post_init__(self) -> None:
        if not self.complexity:
            object.__setattr__(self, "complexity", INTENT_COMPLEXITY[self.intent])


def read_examples(path: Path) -> list[Example]:
    """Every example of a .jsonl or .jsonl.gz file, in file order."""
    opener: Any = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [
            _example(line, path, number) for number, line in enumerate(lines, 1) if line.strip()
        ]


def _example(line: str, path: Path, number: int) -> Example:
    try:
        row = json.loads(line)
        text, intent = row["text"], row["intent"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"{path}:{number}: not a labelled prompt ({exc})") from None
    if not isinstance(text, str) or not isinstance(intent, str) or intent not in INTENT_COMPLEXITY:
        raise DatasetError(f"{path}:{number}: bad text or unknown intent {intent!r}")
    complexity = row.get("complexity") or INTENT_COMPLEXITY[intent]
    if complexity not in ("simple", "complex"):
        raise DatasetError(f"{path}:{number}: complexity must be simple or complex")
    lang, source = str(row.get("lang", "")), str(row.get("source", ""))
    return Example(text, intent, lang, source, complexity)


def files_sha256(paths: Iterable[Path]) -> str:
    """One digest over the bytes of the files, in the order given."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()
