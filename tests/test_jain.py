"""Jain's fairness index (policies.limits.jain), with tables of known values."""

from __future__ import annotations

import pytest

from policies.limits.jain import jain


@pytest.mark.parametrize(("amounts", "expected"), [
    ({"a": 100, "b": 100}, 1.0),  # equal shares
    ({"a": 5, "b": 5, "c": 5, "d": 5}, 1.0),
    ({"a": 100, "b": 0}, 0.5),  # one got everything: 1/n
    ({"a": 7, "b": 0, "c": 0, "d": 0}, 0.25),
    ({"a": 300, "b": 100}, 0.8),  # 400^2 / (2 * 100000)
    ({"a": 1, "b": 2, "c": 3}, 36 / 42),  # 6^2 / (3 * 14)
    ({"a": 42}, 1.0),  # one tenant is fair to itself
    ({}, None),  # no tenant
    ({"a": 0, "b": 0}, None),  # nothing served
])
def test_jain_unweighted(amounts: dict[str, float], expected: float | None) -> None:
    assert jain(amounts) == pytest.approx(expected)


@pytest.mark.parametrize(("amounts", "weights", "expected"), [
    ({"a": 200, "b": 100}, {"a": 2, "b": 1}, 1.0),  # served in proportion to its weight
    ({"a": 100, "b": 100}, {"a": 2, "b": 1}, 0.9),  # x = 50, 100: 150^2 / (2 * 12500)
    ({"a": 300, "b": 100}, {"a": 1, "b": 1}, 0.8),  # weights of 1: as unweighted
    ({"a": 0, "b": 50}, {"a": 0.5, "b": 4}, 0.5),
])
def test_jain_weighted(amounts: dict[str, float], weights: dict[str, float],
                       expected: float) -> None:
    assert jain(amounts, weights) == pytest.approx(expected)
