"""What a request cost, and what it would have cost on its route's primary. Pure arithmetic.

Per-token prices charge the tokens; GPU-time prices charge the slot time, at
gpu_hour x gpus / 3600 / slots per slot-second (a slot is one sequence of the engine).
A batch line's cost, of either kind, is less the price's `batch_discount`.
"""

from __future__ import annotations

from policies.config import PriceConfig

_MTOK = 1_000_000


def slot_second_price(price: PriceConfig, slots: int) -> float:
    """The price of holding one slot for one second (0 for per-token prices)."""
    if price.gpu_hour is None or price.gpus is None:
        return 0.0
    return price.gpu_hour * price.gpus / 3600 / slots


def request_cost(price: PriceConfig | None, slots: int, prompt_tokens: int,
                 completion_tokens: int, slot_s: float, batch: bool = False) -> float:
    """The cost of one request from its usage and its slot time (0 with no price);
    `batch`: a batch line's, at the price less its `batch_discount`."""
    if price is None:
        return 0.0
    if price.input_per_mtok is not None and price.output_per_mtok is not None:
        cost = (prompt_tokens * price.input_per_mtok
                + completion_tokens * price.output_per_mtok) / _MTOK
    else:
        cost = slot_s * slot_second_price(price, slots)
    return cost * (1 - price.batch_discount) if batch else cost
