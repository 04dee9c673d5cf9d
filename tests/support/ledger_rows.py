"""Ledger rows for the stores' tests: the i-th of a run, every field set."""

from __future__ import annotations

from router.ledger.base import LedgerRow


def numbered_row(i: int, **fields: object) -> LedgerRow:
    base: dict[str, object] = dict(
        id=f"row-{i}", ts=1_700_000_000.0 + i, request_id=f"req-{i}", endpoint="chat",
        route="chat", primary="big", experiment="ab", arm="on" if i % 2 else "off",
        tenant="3f2a9c0d1e4b", backend="small" if i % 3 == 0 else "big", reason="primary",
        intent="greeting", p_simple=0.93, stream=bool(i % 2), status=200, error=None,
        disconnect=None, queue_wait_ms=12.5 * i, ttft_ms=80.25, total_ms=900.5,
        slot_ms=850.0, prompt_tokens=10 + i, completion_tokens=100 + i,
        tokens_estimated=False, cost=0.00125 * i, counterfactual_cost=0.0025 * i,
    )
    base.update(fields)
    return LedgerRow(**base)  # type: ignore[arg-type]
