"""Jain's fairness index over what each tenant was served. Pure: no I/O.

J = (sum x)^2 / (n * sum x^2) over n tenants' amounts x: 1 when all got the same, 1/n when
one got everything. Weighted, x is a tenant's amount divided by its weight, so a tenant of
weight 2 served twice as much as one of weight 1 is fair (J = 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from math import fsum


def jain(amounts: Mapping[str, float], weights: Mapping[str, float] | None = None
         ) -> float | None:
    """Jain's index of `amounts` (by tenant), each divided by its weight when `weights`
    is given (every tenant must have one, > 0); None for no tenant or nothing served."""
    if weights is None:
        xs = [float(v) for v in amounts.values()]
    else:
        xs = [amounts[t] / weights[t] for t in amounts]
    squares = fsum(x * x for x in xs)
    if not xs or squares == 0:
        return None
    return fsum(xs) ** 2 / (len(xs) * squares)
