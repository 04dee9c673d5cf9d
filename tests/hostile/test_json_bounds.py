"""The byte-level bounds on a request body (router/request/json_bounds.py) as unit tables:
depth, value count and integers beyond 64 bits, checked against a parser's answer."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.request.json_bounds import check_bounds
from tests.hostile.conftest import nested


def test_brackets_digits_and_quotes_inside_strings_do_not_count() -> None:
    text = '[[[[{{{{ 123456789012345678901234567890 \\" [[[[ \\\\'
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text * 40}],
                         "x": 1.123456789012345678901234, "y": 1e-300, "z": -9223372036854775808,
                         "u": 18446744073709551615})
    assert check_bounds(body, 4, 1024) is None
    padded = body[:-1] + b',"pad":"' + b"{[" * 20_000 + b'"}'  # the numpy path
    assert check_bounds(padded, 4, 1024) is None


@pytest.mark.parametrize("number", [b"18446744073709551616", b"-9223372036854775809",
                                    b"100000000000000000000000000000"])
@pytest.mark.parametrize("pad", [0, 40_000])
def test_an_integer_beyond_64_bits_is_named_with_its_field(number: bytes, pad: int) -> None:
    body = b'{"model":"m","p":"' + b"x" * pad + b'","tools":[{"a":[1,' + number + b"]}]}"
    breach = check_bounds(body, 64, 262_144)
    assert breach is not None and breach.param == "tools"
    assert number.decode() in breach.message


def test_value_count_and_depth_beyond_the_limits() -> None:
    many = b'{"model":"m","x":[' + b",".join([b"{}"] * 5000) + b"]}"
    breach = check_bounds(many, 64, 1024)
    assert breach is not None and "more than 1024 JSON values" in breach.message
    assert check_bounds(many, 64, 262_144) is None
    for depth in (65, 300, 1023):
        breach = check_bounds(nested(depth), 64, 262_144)
        assert breach is not None and f"nests {depth} levels" in breach.message
    assert check_bounds(nested(64), 64, 262_144) is None


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False)
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.text(alphabet='[]{}"\\,:0123456789ab', max_size=30),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(alphabet='[]{}"\\:0', max_size=5), inner, max_size=4),
    max_leaves=40,
)


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


def _beyond_64_bits(value: object) -> bool:
    if isinstance(value, list):
        return any(_beyond_64_bits(v) for v in value)
    if isinstance(value, dict):
        return any(_beyond_64_bits(v) for v in value.values())
    return (isinstance(value, int) and not isinstance(value, bool)
            and not -(2**63) <= value <= 2**64 - 1)


def _values(value: object) -> int:
    """Commas and opening brackets outside strings, + 1: what `max_json_values` counts."""
    if isinstance(value, list | dict):
        items = list(value.values()) if isinstance(value, dict) else value
        return max(len(items) - 1, 0) + 1 + sum(_values(v) - 1 for v in items) + 1
    return 1


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES, st.integers(min_value=2, max_value=8), st.integers(min_value=2, max_value=60),
       st.booleans())
def test_the_scan_agrees_with_a_parser(value: object, depth_limit: int, values_limit: int,
                                       numpy_path: bool) -> None:
    pad = "p" * (20_000 if numpy_path else 0)
    doc = {"pad": pad, "v": value}
    raw = json.dumps(doc, indent=None if numpy_path else 1).encode()
    breach = check_bounds(raw, depth_limit, values_limit)
    many = _values(doc) > values_limit
    deep, big = _depth(doc) > depth_limit, _beyond_64_bits(value)
    assert (breach is not None) == (many or deep or big)
    if many:
        assert breach is not None and "JSON values" in breach.message
    elif breach is not None and not deep:
        assert breach.param == "v"


@pytest.mark.parametrize("strings", [10, 3000])
def test_commas_inside_strings_are_not_values(strings: int) -> None:
    items = ["a,b,c,[d,{e"] * strings
    raw = orjson.dumps({"model": "m", "x": items, "pad": "," * 300_000})
    counted = (strings - 1) + 2 + 2 + 1  # commas in the list and the object, 2 opens, + 1
    assert check_bounds(raw, 64, counted) is None
    breach = check_bounds(raw, 64, counted - 1)
    assert breach is not None and "JSON values" in breach.message


# --- through the gateway ----------------------------------------------------------------
