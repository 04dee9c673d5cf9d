"""Hashed features of one text: character n-grams, word n-grams and a few shape signals.

Our own hashing, vectorised over code points with numpy (no per-token Python loop), so
prediction needs no fitted object and training and prediction share this one function.
No I/O.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from classifier.text import clip

Indices = npt.NDArray[np.int64]
Values = npt.NDArray[np.float32]
_U64 = npt.NDArray[np.uint64]
_U8 = npt.NDArray[np.uint8]

# Dense signals appended after the hashed block, in this order.
SHAPE_NAMES: Final[tuple[str, ...]] = (
    "len<16",
    "len<40",
    "len<100",
    "len<250",
    "len<600",
    "len<1500",
    "len>=1500",
    "lines=1",
    "lines<=3",
    "lines<=10",
    "lines>10",
    "qmark=0",
    "qmark=1",
    "qmark>=2",
    "code_fence",
    "code_indent",
    "code_punct",
    "math_symbols",
    "latex",
    "digits",
    "has_digit",
    "cjk_ratio",
    "latin_ratio",
    "quoted",
    "colon",
)
_LEN_EDGES: Final = (16, 40, 100, 250, 600, 1500)
_LINE_EDGES: Final = (1, 3, 10)  # on the number of newlines


@dataclass(frozen=True)
class FeatureSettings:
    """Everything that shapes a feature vector; stored in the artifact's metadata."""

    hash_bits: int = 16
    char_min: int = 1
    char_max: int = 4
    word_min: int = 1
    word_max: int = 2
    char_weight: float = 1.0
    word_weight: float = 1.0
    shape_weight: float = 1.0
    sublinear_tf: bool = True  # 1 + log(count) instead of the count

    @property
    def n_hashed(self) -> int:
        return 1 << self.hash_bits

    @property
    def n_features(self) -> int:
        return self.n_hashed + len(SHAPE_NAMES)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FeatureSettings:
        return cls(**data)


def featurize(text: str, settings: FeatureSettings) -> tuple[Indices, Values]:
    """Sparse feature vector of `text` as (column indices, values); indices may repeat.

    Char n-grams carry Chinese (no spaces) and spelling; word n-grams carry English
    phrasing. Words are runs of letters or of digits; every other non-space character
    (a CJK character, a symbol) is a word of its own. Digits all hash as "0".
    """
    lowered = clip(text).strip().lower()
    raw = np.frombuffer(lowered.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    points, kinds = _collapse_spaces(_fold_width(raw.astype(np.uint64)))
    shift = np.uint64(64 - settings.hash_bits)

    padded: _U64 = np.concatenate((_SPACE_POINT, points, _SPACE_POINT))
    char_keys = _ngram_keys(padded, settings.char_min, settings.char_max, _CHAR_SALT)
    words: _U64 = np.concatenate((_BOUNDARY, _word_hashes(points, kinds), _BOUNDARY))
    word_keys = _ngram_keys(words, settings.word_min, settings.word_max, _WORD_SALT)

    char_idx, char_val = _normalised(char_keys >> shift, settings.char_weight, settings)
    word_idx, word_val = _normalised(word_keys >> shift, settings.word_weight, settings)
    shape = _shape(lowered, kinds) * np.float32(settings.shape_weight)
    shape_idx = np.flatnonzero(shape)
    return (
        np.concatenate((char_idx, word_idx, shape_idx + settings.n_hashed)),
        np.concatenate((char_val, word_val, shape[shape_idx])),
    )


def cjk_share(text: str) -> float:
    """The share of kana and CJK ideographs in `text`, as `featurize` reads it (clipped,
    full-width ASCII folded, each run of whitespace one character): its "cjk_ratio"
    signal; 0.0 for a text of whitespace only."""
    lowered = clip(text).strip().lower()
    raw = np.frombuffer(lowered.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    _, kinds = _collapse_spaces(_fold_width(raw.astype(np.uint64)))
    return float(np.count_nonzero(kinds == _HAN)) / max(1, kinds.size)


# --- character kinds -------------------------------------------------------------------

_OTHER, _SPACE, _DIGIT, _LETTER, _HAN, _CODE, _MATH, _QMARK, _QUOTE, _COLON = range(10)
_N_KINDS: Final = 10


def _kind_table() -> _U8:
    """Kind of every BMP code point (fixed ranges, not unicodedata: stable across Pythons)."""
    table = np.full(0x10000, _OTHER, dtype=np.uint8)
    for lo, hi in ((0x61, 0x7B), (0xC0, 0x250), (0x370, 0x530), (0xAC00, 0xD7A4)):
        table[lo:hi] = _LETTER  # Latin, Greek, Cyrillic, Armenian, Hangul: spaced scripts
    table[[0xD7, 0xF7]] = _MATH  # x and / signs sit inside Latin-1
    for lo, hi in ((0x3040, 0x3100), (0x3400, 0x4DC0), (0x4E00, 0xA000), (0xF900, 0xFB00)):
        table[lo:hi] = _HAN  # kana and CJK ideographs: unspaced, one word per character
    groups = {
        _SPACE: " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\u2028\u2029\u3000\ufeff",
        _DIGIT: "0123456789",
        _CODE: "{}[]();_#\\|&`",
        _MATH: "+-*/^=<>√∫∑∏π±≤≥≠≈∞∠△°αβγθλσ∈∀∃⊂∪∩",
        _QMARK: "?",
        _QUOTE: "\"'“”‘’「」『』《》",
        _COLON: ":",
    }
    for kind, chars in groups.items():
        table[[ord(c) for c in chars]] = kind
    return table


_KINDS: Final = _kind_table()
_WIDE_FIRST, _WIDE_LAST, _WIDE_OFFSET = np.uint64(0xFF01), np.uint64(0xFF5E), np.uint64(0xFEE0)


def _fold_width(points: _U64) -> _U64:
    """Full-width ASCII (common in Chinese text: ，？：（）) as plain ASCII, in place.

    What NFKC would do for these, at a fraction of its cost on CJK text.
    """
    wide = (points >= _WIDE_FIRST) & (points <= _WIDE_LAST)
    points[wide] -= _WIDE_OFFSET
    return points


def _collapse_spaces(points: _U64) -> tuple[_U64, _U8]:
    """Strip the ends, turn each run of whitespace into one space; kinds alongside."""
    kinds = _KINDS[np.minimum(points, np.uint64(0xFFFF))]
    space = kinds == _SPACE
    keep = ~space
    keep[1:] |= space[1:] & ~space[:-1]  # the first space of each run
    if space.size and (space[0] or space[-1]):  # str.strip() missed some (a BOM, say)
        solid = np.flatnonzero(~space)
        if solid.size == 0:
            return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint8)
        keep[: solid[0]] = False
        keep[solid[-1] + 1 :] = False
    points = np.where(space, np.uint64(0x20), points)[keep]
    kinds = kinds[keep]
    points[kinds == _DIGIT] = 0x30
    return points, kinds


# --- hashing ---------------------------------------------------------------------------

_PRIME: Final = 0x100000001B3  # odd, so it has an inverse modulo 2**64
_PRIME_INV: Final = pow(_PRIME, -1, 1 << 64)
_PRIME_U64: Final = np.uint64(_PRIME)
_MULT: Final = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: keep the top bits
_CHAR_SALT: Final = 0xBF58476D1CE4E5B9
_WORD_SALT: Final = 0x94D049BB133111EB
_SPACE_POINT: Final = np.array([0x20], dtype=np.uint64)
_BOUNDARY: Final = np.array([2], dtype=np.uint64)  # start/end of text, so "write ..." differs
_SPACE_KIND = np.uint8(_SPACE)
_IS_RUN: Final = np.zeros(_N_KINDS, dtype=bool)
_IS_RUN[[_LETTER, _DIGIT]] = True  # kinds whose characters join into one word


def _power_table(base: int, n: int) -> _U64:
    steps = np.full(n, base, dtype=np.uint64)
    steps[0] = 1
    return np.cumprod(steps)  # wraps modulo 2**64, as intended


# Texts are clipped to 2,000 characters (lower() may lengthen a few); longer ones pay a cumprod.
_POWERS_KEPT: Final = 4096
_POWERS: Final = _power_table(_PRIME, _POWERS_KEPT)
_POWERS_INV: Final = _power_table(_PRIME_INV, _POWERS_KEPT)


def _powers(n: int) -> tuple[_U64, _U64]:
    if n <= _POWERS_KEPT:
        return _POWERS[:n], _POWERS_INV[:n]
    return _power_table(_PRIME, n), _power_table(_PRIME_INV, n)


def _word_hashes(points: _U64, kinds: _U8) -> _U64:
    """One 64-bit hash per word: sum of points[j] * PRIME**-(j - start), wrapping."""
    if points.size == 0:
        return np.zeros(0, dtype=np.uint64)
    # A letter or digit continues the word when the character before it is of its kind;
    # a space between them has its own kind, so it always ends the word.
    continues = np.zeros(points.size, dtype=bool)
    continues[1:] = _IS_RUN[kinds[1:]] & (kinds[1:] == kinds[:-1])
    space = kinds == _SPACE_KIND
    first = (~continues & ~space).nonzero()[0]
    powers, inverse = _powers(points.size)
    terms = points * inverse
    terms[space] = 0  # a segment runs to the next word's start: its trailing space adds 0
    hashes: _U64 = np.add.reduceat(terms, first) * powers[first]
    return hashes


@functools.cache
def _salt(salt: int, n: int) -> np.uint64:
    """A distinct key space per feature group and n-gram order."""
    return np.uint64((salt * n) & 0xFFFFFFFFFFFFFFFF)


def _ngram_keys(units: _U64, lo: int, hi: int, salt: int) -> _U64:
    """64-bit keys of every n-gram (lo <= n <= hi) of `units`; one array op per order."""
    keys: list[_U64] = []
    rolling = units
    for n in range(1, hi + 1):
        if n > 1:
            rolling = rolling[:-1] * _PRIME_U64 + units[n - 1 :]
        if rolling.size == 0:
            break
        if n >= lo:
            keys.append((rolling ^ _salt(salt, n)) * _MULT)
    return np.concatenate(keys) if keys else np.zeros(0, dtype=np.uint64)


def _normalised(buckets: _U64, weight: float, settings: FeatureSettings) -> tuple[Indices, Values]:
    if buckets.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    # Small unsigned types sort several times faster than int64.
    ordered = np.sort(buckets.astype(np.uint16 if settings.hash_bits <= 16 else np.uint32))
    new = np.empty(ordered.size, dtype=bool)  # np.unique, without its per-call overhead
    new[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    first = new.nonzero()[0]
    index = ordered[first].astype(np.int64)
    values = np.empty(first.size, dtype=np.float32)  # the count of each distinct bucket
    values[:-1] = first[1:] - first[:-1]
    values[-1] = ordered.size - first[-1]
    if settings.sublinear_tf:
        values = np.log(values) + np.float32(1.0)
    values *= np.float32(weight) / np.sqrt(np.dot(values, values))
    return index, values


# --- shape -----------------------------------------------------------------------------

_LATEX: Final = re.compile(r"\\[a-z]{2,}|\$[^$\n]+\$")
_LINES_AT: Final = SHAPE_NAMES.index("lines=1")
_QMARK_AT: Final = SHAPE_NAMES.index("qmark=0")
_CODE_AT: Final = SHAPE_NAMES.index("code_fence")  # the single signals follow in order


def _shape(lowered: str, kinds: _U8) -> Values:
    """Cheap structural signals, each in [0, 1], in SHAPE_NAMES order."""
    out = np.zeros(len(SHAPE_NAMES), dtype=np.float32)
    n = max(1, kinds.size)
    counts = np.bincount(kinds, minlength=_N_KINDS)
    out[_bucket(kinds.size, _LEN_EDGES)] = 1.0
    out[_LINES_AT + _bucket(lowered.count("\n"), _LINE_EDGES)] = 1.0
    out[_QMARK_AT + min(2, int(counts[_QMARK]))] = 1.0
    out[_CODE_AT] = "```" in lowered
    out[_CODE_AT + 1] = "\n    " in lowered or "\n\t" in lowered
    out[_CODE_AT + 2] = min(1.0, 8.0 * counts[_CODE] / n)
    out[_CODE_AT + 3] = min(1.0, counts[_MATH] / 8.0)
    out[_CODE_AT + 4] = _LATEX.search(lowered) is not None
    out[_CODE_AT + 5] = min(1.0, 4.0 * counts[_DIGIT] / n)
    out[_CODE_AT + 6] = counts[_DIGIT] > 0
    out[_CODE_AT + 7] = counts[_HAN] / n
    out[_CODE_AT + 8] = counts[_LETTER] / n
    out[_CODE_AT + 9] = counts[_QUOTE] > 0
    out[_CODE_AT + 10] = counts[_COLON] > 0
    return out


def _bucket(value: int, edges: tuple[int, ...]) -> int:
    for i, edge in enumerate(edges):
        if value < edge:
            return i
    return len(edges)
