"""Batch work in `slotgate report`: each tenant's batch tokens and cost beside its
interactive ones, and per backend the slot-seconds batch lines held and the share of the
idle capacity they filled.

A row is a batch line when the ledger marked it so (rows written before the ledger kept the
mark count as interactive). The window is the report's rows' span: from the first row's
arrival to the last row's end (`ts + total_ms`). Per backend (the one that served the row):

- interactive_slot_s, batch_slot_s: the sum of `slot_ms` / 1000 of its interactive rows,
  of its batch lines.
- idle_slot_s: slots x window - interactive_slot_s, `slots` being the backend's in the
  config; None for a backend the config no longer has, or an empty window.
- idle_filled: batch_slot_s / idle_slot_s; None when idle_slot_s is None or not above 0.

Tenants (rows without one: "(none)") are listed most batch tokens first, then most tokens
in all; beyond TENANT_ROWS they are folded into "(more)". Present only when some row is
a batch line, so a report of interactive traffic alone is as it was.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from math import fsum
from typing import Any

from router.ledger.base import LedgerRow
from router.report.tenants import MORE, NONE_GROUP, TENANT_ROWS


def batch_breakdown(rows: Sequence[LedgerRow],
                    slots: Mapping[str, int]) -> dict[str, Any] | None:
    """{"window": {...}, "tenants": [...], "backends": [...]}; None when no row is a batch
    line. `slots`: each configured backend's."""
    if not any(r.batch for r in rows):
        return None
    start = min(r.ts for r in rows)
    end = max(r.ts + r.total_ms / 1000 for r in rows)
    window = end - start
    return {"window": {"start_ts": start, "end_ts": end, "seconds": window},
            "tenants": _tenants(rows),
            "backends": [_backend(name, served, slots.get(name), window)
                         for name, served in _by([r for r in rows if r.backend is not None],
                                                 lambda r: str(r.backend)).items()]}


def _figures(rows: Sequence[LedgerRow]) -> dict[str, Any]:
    return {"requests": len(rows),
            "tokens": sum(r.prompt_tokens + r.completion_tokens for r in rows),
            "cost": fsum(r.cost for r in rows)}


def _split(name: str, rows: Sequence[LedgerRow]) -> dict[str, Any]:
    return {"tenant": name, "interactive": _figures([r for r in rows if not r.batch]),
            "batch": _figures([r for r in rows if r.batch])}


def _tenants(rows: Sequence[LedgerRow]) -> list[dict[str, Any]]:
    by_tenant = _by(rows, lambda r: r.tenant if r.tenant is not None else NONE_GROUP)
    split = {name: _split(name, tenant_rows) for name, tenant_rows in by_tenant.items()}
    order = sorted(split, key=lambda t: (-split[t]["batch"]["tokens"],
                                         -split[t]["interactive"]["tokens"], t))
    shown = [split[t] for t in order[:TENANT_ROWS]]
    if folded := order[TENANT_ROWS:]:
        shown.append(_split(MORE, [r for t in folded for r in by_tenant[t]]))
    return shown


def _backend(name: str, rows: Sequence[LedgerRow], slots: int | None,
             window: float) -> dict[str, Any]:
    interactive = fsum(r.slot_ms for r in rows if not r.batch) / 1000
    batch = fsum(r.slot_ms for r in rows if r.batch) / 1000
    idle = slots * window - interactive if slots is not None and window > 0 else None
    return {"backend": name, "slots": slots, "batch_lines": sum(1 for r in rows if r.batch),
            "interactive_slot_s": interactive, "batch_slot_s": batch, "idle_slot_s": idle,
            "idle_filled": batch / idle if idle is not None and idle > 0 else None}


def _by(rows: Iterable[LedgerRow], key: Callable[[LedgerRow], str]
        ) -> dict[str, list[LedgerRow]]:
    """Rows by key, in sorted key order."""
    groups: dict[str, list[LedgerRow]] = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    return {name: groups[name] for name in sorted(groups)}
