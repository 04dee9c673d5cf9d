"""Bounds checked on a request body's bytes before it is parsed: nesting depth, number of
values, and integers that would not survive parsing (beyond 64 bits, which orjson turns
into floats). No I/O; nothing here changes the body.

Each check is first an upper bound from byte counts (a bracket, comma or digit inside a
string counts too), so a body well within the limits costs a few C-speed passes. Only a
body whose counts pass a limit gets the exact scan, which leaves out what is inside
strings: the unescaped quotes are found with numpy, and a position is inside a string
when an odd number of them precede it. For a body that is not valid JSON the answer may
be anything; orjson refuses such a body afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

_NUMPY_FROM = 16 * 1024  # below this size, bytes methods beat numpy's per-call overhead
_FEW_STRINGS = 256  # up to this many, count inside each string rather than locate each comma
_DIGITS = bytes(48 if 48 <= i <= 57 else 32 for i in range(256))  # digit -> "0", else " "
_DIGIT_RUN = b"0" * 19  # an integer of fewer digits always fits in 64 bits
_WORD = int.from_bytes(b"\x01" * 8, "little")  # eight digits in a row, as one uint64
_U64_MAX_DIGITS = np.frombuffer(str(2**64 - 1).encode(), np.uint8)
_I64_MIN_DIGITS = np.frombuffer(str(2**63).encode(), np.uint8)  # after the "-"
_FLOAT_AFTER = np.frombuffer(b".eE", np.uint8)
_FLOAT_BEFORE = np.frombuffer(b".eE+", np.uint8)
_EXPONENT = np.frombuffer(b"eE", np.uint8)

Positions = npt.NDArray[np.intp]
Bytes = npt.NDArray[np.uint8]


@dataclass(frozen=True, slots=True)
class Breach:
    """What is wrong with a body: a message for the client, and the field if known."""

    message: str
    param: str | None = None


def check_bounds(raw: bytes, max_depth: int, max_values: int) -> Breach | None:
    """None if `raw` nests at most `max_depth` levels (the top object is level 1), holds
    at most `max_values` values and no integer beyond 64 bits; else what breaches."""
    data = None if len(raw) < _NUMPY_FROM else np.frombuffer(raw, np.uint8)
    count_commas = len(raw) >= max_values  # fewer bytes cannot hold more values
    if data is None:
        opens = raw.count(b"[") + raw.count(b"{")
        commas = raw.count(b",") if count_commas else 0
        long_digits = _DIGIT_RUN in raw.translate(_DIGITS)
    else:
        head = data[:4 * max_values]  # a flood of values shows in its first bytes: say so
        if len(head) < len(data) and _separators(head) >= max_values:  # before the rest
            if _Scan(head).values() > max_values:
                return _too_many(max_values)
        opens = int(np.count_nonzero(data == 0x5B) + np.count_nonzero(data == 0x7B))
        commas = int(np.count_nonzero(data == 0x2C)) if count_commas else 0
        long_digits = _has_digit_run(data)
    too_many = opens + commas + 1 > max_values
    if opens <= max_depth and not too_many and not long_digits:
        return None  # the common case: no exact scan
    if data is None:
        data = np.frombuffer(raw, np.uint8)
    scan = _Scan(data)
    if too_many:
        # With many strings, a flood shows in its first bytes: scan a growing prefix (at
        # most twice the work of one whole scan), so refusing one costs a fraction of it.
        end = len(data) if scan.few_strings() else min(len(data), 4 * max_values)
        while (scan if end == len(data) else _Scan(data[:end])).values() <= max_values:
            if end == len(data):
                break
            end = min(len(data), 2 * end)
        else:
            return _too_many(max_values)
    if opens > max_depth and (depth := scan.depth()) > max_depth:
        return Breach(f"The request body nests {depth} levels deep; the limit is "
                      f"{max_depth} (server.max_json_depth).")
    if long_digits and (span := scan.big_integer()) is not None:
        number = raw[span[0]:span[1]]
        shown = number.decode() if len(number) <= 40 else f"{number[:40].decode()}..."
        field = scan.field_at(span[0])
        where = f" in '{field}'" if field else ""
        return Breach(f"The integer {shown}{where} does not fit in 64 bits; send it as a "
                      "string.", field)
    return None


def _too_many(max_values: int) -> Breach:
    return Breach(f"The request body holds more than {max_values} JSON values "
                  "(server.max_json_values).")


def _has_digit_run(data: Bytes) -> bool:
    """Whether a run of 15 or more digits may exist (every run of 19 does): such a run
    covers an aligned block of eight bytes, compared as one uint64."""
    # A run of 19 that reaches into the unaligned tail still covers the block before it.
    digits = (data[:len(data) // 8 * 8] - 48) < 10  # uint8 wraps: only digits are below 10
    return bool(np.any(digits.view(np.uint64) == _WORD))


class _Scan:
    """The exact answers, with what is inside strings left out."""

    def __init__(self, data: Bytes) -> None:
        self.data = data
        self._quotes: Positions | None = None
        self._brackets: tuple[Positions, Positions] | None = None

    def quotes(self) -> Positions:
        """The positions of the quotes that open or close a string."""
        if self._quotes is None:
            quotes = np.flatnonzero(self.data == 0x22)
            if len(quotes) and np.any(self.data == 0x5C):
                quotes = quotes[~self._escaped(quotes)]
            self._quotes = quotes
        return self._quotes

    def _escaped(self, quotes: Positions) -> npt.NDArray[np.bool_]:
        """Which quotes follow an odd run of backslashes."""
        starts, ends = _runs(self.data == 0x5C)
        at = np.minimum(np.searchsorted(ends, quotes), len(ends) - 1)
        ending = ends[at] == quotes  # a run of backslashes ends right at the quote
        odd: npt.NDArray[np.bool_] = ending & ((ends[at] - starts[at]) % 2 == 1)
        return odd

    def outside(self, positions: Positions) -> Positions:
        inside = np.searchsorted(self.quotes(), positions, side="right") % 2 == 1
        kept: Positions = positions[~inside]
        return kept

    def brackets(self) -> tuple[Positions, Positions]:
        """Opening and closing brackets outside strings."""
        if self._brackets is None:
            data = self.data
            self._brackets = (self.outside(np.flatnonzero((data == 0x5B) | (data == 0x7B))),
                              self.outside(np.flatnonzero((data == 0x5D) | (data == 0x7D))))
        return self._brackets

    def few_strings(self) -> bool:
        return len(self.quotes()) <= 2 * _FEW_STRINGS

    def values(self) -> int:
        """About the number of values: commas and opening brackets outside strings, + 1."""
        quotes = self.quotes()
        if not self.few_strings():
            commas = self.outside(np.flatnonzero(self.data == 0x2C))
            return len(self.brackets()[0]) + len(commas) + 1
        # Few strings (long text): count between them, slice by slice.
        bounds = [-1, *quotes.tolist()]
        if len(bounds) % 2:  # every string closed: the tail after the last is outside
            bounds.append(len(self.data))
        return sum(_separators(self.data[start + 1:end])
                   for start, end in zip(bounds[::2], bounds[1::2], strict=True)) + 1

    def depth(self) -> int:
        opens, closes = self.brackets()
        if not len(opens):
            return 0
        return int((np.arange(1, len(opens) + 1) - np.searchsorted(closes, opens)).max())

    def field_at(self, position: int) -> str | None:
        """The top-level field whose value holds `position` (for an error's `param`)."""
        opens, closes = self.brackets()
        if not len(opens):
            return None
        commas = self.outside(np.flatnonzero(self.data[:position] == 0x2C))
        levels = np.searchsorted(opens, commas) - np.searchsorted(closes, commas)
        members = commas[levels == 1]
        after = int(members[-1]) if len(members) else int(opens[0])
        quotes = self.quotes()
        at = int(np.searchsorted(quotes, after))
        if at + 1 >= len(quotes) or quotes[at + 1] > position:
            return None
        return bytes(self.data[quotes[at] + 1:quotes[at + 1]]).decode(errors="replace")

    def big_integer(self) -> tuple[int, int] | None:
        """The span of the first integer outside strings that does not fit in 64 bits
        (orjson would make it a float); the digits of a float are left alone."""
        data = self.data
        starts, ends = _runs(data - 48 < 10)  # uint8 wraps: only digits are below 10
        long = ends - starts >= 19
        starts, ends = starts[long], ends[long]
        keep = np.searchsorted(self.quotes(), starts, side="right") % 2 == 0
        starts, ends = starts[keep], ends[keep]
        if not len(starts):
            return None
        before = _byte_at(data, starts - 1)
        floaty = (np.isin(_byte_at(data, ends), _FLOAT_AFTER)
                  | np.isin(before, _FLOAT_BEFORE)
                  | ((before == 0x2D) & np.isin(_byte_at(data, starts - 2), _EXPONENT)))
        negative = before == 0x2D
        length = ends - starts
        over = np.zeros(len(starts), np.bool_)
        for sign, limit in ((negative, _I64_MIN_DIGITS), (~negative, _U64_MAX_DIGITS)):
            over |= sign & (length > len(limit))
            same = np.flatnonzero(sign & (length == len(limit)))
            over[same] = _greater(data, starts[same], limit)
        found = np.flatnonzero(over & ~floaty)
        if not len(found):
            return None
        first = int(found[0])
        return int(starts[first]) - int(negative[first]), int(ends[first])


def _separators(data: Bytes) -> int:
    """Commas and opening brackets in `data`."""
    return int(np.count_nonzero(data == 0x2C) + np.count_nonzero(data == 0x5B)
               + np.count_nonzero(data == 0x7B))


def _runs(mask: npt.NDArray[np.bool_]) -> tuple[Positions, Positions]:
    """Where each run of True starts, and where it ends (exclusive)."""
    padded = np.zeros(len(mask) + 2, np.int8)
    padded[1:-1] = mask
    edges = np.diff(padded)
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def _byte_at(data: Bytes, positions: Positions) -> Bytes:
    """The bytes at `positions`; a space where a position falls outside the data."""
    valid = (positions >= 0) & (positions < len(data))
    out = np.full(len(positions), 0x20, np.uint8)
    out[valid] = data[positions[valid]]
    return out


def _greater(data: Bytes, starts: Positions, limit: Bytes) -> npt.NDArray[np.bool_]:
    """Whether each run of len(limit) digits from `starts` reads greater than `limit`."""
    digits = data[starts[:, None] + np.arange(len(limit))]
    differ = digits != limit
    first = differ.argmax(axis=1)
    greater: npt.NDArray[np.bool_] = differ.any(axis=1) & (
        digits[np.arange(len(starts)), first] > limit[first])
    return greater
