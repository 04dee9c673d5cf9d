"""Ledger rows in tests: read back what a gateway wrote, or written by hand."""

from __future__ import annotations

from router.app import RunningGateway
from router.ledger.base import LedgerRow, RowFilter
from router.ledger.open import open_store


async def rows_of(gw: RunningGateway, target: str) -> list[LedgerRow]:
    """Every ledger row the gateway wrote to `target`, after closing it gracefully."""
    await gw.close()  # graceful: every row is written before it returns
    store = open_store(target)
    await store.open()
    try:
        return await store.fetch(RowFilter())
    finally:
        await store.close()


T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def row(key: str, dt: float, arm: str | None, backend: str | None, status: int = 200, *,
        error: str | None = None, wait: float = 0.0, ttft: float | None = None,
        tokens: tuple[int, int] = (0, 0), estimated: bool = False, cost: float = 0.0,
        counterfactual: float = 0.0, experiment: str | None = "exp1",
        route: str = "chat") -> LedgerRow:
    """One ledger row written by hand, `dt` seconds after T0."""
    return LedgerRow(
        id=key, ts=T0 + dt, request_id=key, endpoint="chat", route=route, primary="big",
        experiment=experiment, arm=arm, tenant=None, backend=backend, reason=None, intent=None,
        p_simple=None, stream=False, status=status, error=error,
        disconnect="queued" if status == 499 else None, queue_wait_ms=wait, ttft_ms=ttft,
        total_ms=0.0, slot_ms=0.0, prompt_tokens=tokens[0], completion_tokens=tokens[1],
        tokens_estimated=estimated, cost=cost, counterfactual_cost=counterfactual)


def hand_ledger() -> list[LedgerRow]:
    """Fourteen requests over two arms, two backends and one row without an arm."""
    return [
        # arm "off": everything on the primary "big"
        row("off1", 0, "off", "big", wait=0, ttft=100, tokens=(10, 20), cost=0.10,
            counterfactual=0.10),
        row("off2", 10, "off", "big", wait=100, ttft=200, tokens=(20, 40), cost=0.20,
            counterfactual=0.20),
        row("off3", 20, "off", "big", wait=200, ttft=300, tokens=(30, 60), estimated=True,
            cost=0.30, counterfactual=0.30),
        row("off4", 30, "off", "big", 429, error="queue_full", wait=0, tokens=(15, 0)),
        row("off5", 40, "off", "big", 503, error="queue_timeout", wait=1000, tokens=(25, 0),
            estimated=True),
        row("off6", 50, "off", "big", 502, error="upstream_error", wait=400, tokens=(5, 0)),
        # arm "on": simple requests go to "small"
        row("on1", 5, "on", "small", wait=0, ttft=50, tokens=(10, 20), cost=0.01,
            counterfactual=0.10),
        row("on2", 15, "on", "small", wait=0, ttft=60, tokens=(20, 40), cost=0.02,
            counterfactual=0.20),
        row("on3", 25, "on", "big", wait=300, ttft=250, tokens=(30, 60), cost=0.30,
            counterfactual=0.30),
        row("on4", 35, "on", "big", 499, wait=500, tokens=(8, 0)),
        row("on5", 45, "on", "small", 504, error="upstream_timeout", wait=0, ttft=80,
            tokens=(12, 0), estimated=True),
        row("on6", 55, "on", "big", wait=100, ttft=150, tokens=(10, 10), estimated=True,
            cost=0.05, counterfactual=0.05),
        row("on7", 60, "on", None, 400, error="invalid_request", tokens=(3, 0)),
        # no experiment at all
        row("none1", 100, None, "big", wait=50, ttft=120, tokens=(5, 5), cost=0.02,
            counterfactual=0.02, experiment=None, route="other"),
    ]
