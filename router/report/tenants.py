"""Each tenant's part of each backend in `slotgate report`, and how fair the split was.

Rows are grouped by the backend that served them, else their route's primary (refused
before reaching a backend: their 429s count against the pool they asked for), else
"(none)"; within it by tenant (rows without one: "(none)"). Each tenant has the figures of
`group_stats` over its rows, plus `tokens` (prompt + completion), `token_share` (its part of
the backend's tokens) and `weight` (from the config's keys, None when unknown). At most
TENANT_ROWS tenants are listed, most tokens first; the rest are folded into "(more)".

`fairness` is Jain's index (policies.limits.jain) over the tokens of every tenant of the
backend ("(none)" is no tenant), divided by their weights when every one is known
(`weighted`: true); else over the tokens as served. Present when some row has a tenant.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from policies.config import ApiKeyConfig
from policies.limits.jain import jain
from router.ledger.base import LedgerRow

NONE_GROUP = "(none)"
MORE = "(more)"  # the tenants beyond TENANT_ROWS, together
TENANT_ROWS = 20

Stats = Callable[[Sequence[LedgerRow]], dict[str, Any]]


def tenant_weights(keys: Iterable[ApiKeyConfig]) -> dict[str, float]:
    """Each tenant's weight: its keys', when they agree (a tenant whose keys differ has
    none: its share is not one number)."""
    found: dict[str, set[float]] = defaultdict(set)
    for key in keys:
        found[key.tenant].add(key.weight)
    return {tenant: next(iter(w)) for tenant, w in found.items() if len(w) == 1}


def tenant_breakdown(rows: Sequence[LedgerRow], stats: Stats,
                     weights: Mapping[str, float]) -> list[dict[str, Any]] | None:
    """[{"backend", "tokens", "fairness", "tenants": [...]}] by backend name; None when no
    row has a tenant."""
    if all(r.tenant is None for r in rows):
        return None
    by_backend: dict[str, list[LedgerRow]] = defaultdict(list)
    for r in rows:
        by_backend[r.backend or r.primary or NONE_GROUP].append(r)
    names = sorted(b for b in by_backend if b != NONE_GROUP)
    names += [NONE_GROUP] if NONE_GROUP in by_backend else []
    return [_backend(name, by_backend[name], stats, weights) for name in names]


def _backend(name: str, rows: list[LedgerRow], stats: Stats,
             weights: Mapping[str, float]) -> dict[str, Any]:
    by_tenant: dict[str, list[LedgerRow]] = defaultdict(list)
    for r in rows:
        by_tenant[r.tenant if r.tenant is not None else NONE_GROUP].append(r)
    tokens = {t: sum(r.prompt_tokens + r.completion_tokens for r in rs)
              for t, rs in by_tenant.items()}
    total = sum(tokens.values())
    order = sorted(by_tenant, key=lambda t: (-tokens[t], t))
    shown, folded = order[:TENANT_ROWS], order[TENANT_ROWS:]
    tenants = [_tenant(t, by_tenant[t], tokens[t], total, stats, weights.get(t))
               for t in shown]
    if folded:
        tenants.append(_tenant(MORE, [r for t in folded for r in by_tenant[t]],
                               sum(tokens[t] for t in folded), total, stats, None))
    served = {t: float(x) for t, x in tokens.items() if t != NONE_GROUP}
    weighted = bool(served) and all(t in weights for t in served)
    return {"backend": name, "tokens": total, "tenants": tenants,
            "fairness": {"jain": jain(served, weights if weighted else None),
                         "weighted": weighted, "tenants": len(served)}}


def _tenant(name: str, rows: list[LedgerRow], tokens: int, total: int, stats: Stats,
            weight: float | None) -> dict[str, Any]:
    return {"tenant": name, "weight": weight, **stats(rows), "tokens": tokens,
            "token_share": tokens / total if total else None}
