"""What a request cost, and what it would have cost on its route's primary. Pure arithmetic.

Per-token prices charge the tokens; GPU-time prices charge the slot time, at
gpu_hour x gpus / 3600 / slots per slot-second (a slot is one sequence of the engine).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from policies.config import PriceConfig

_MTOK = 1_000_000


def slot_second_price(price: PriceConfig, slots: int) -> float:
    """The price of holding one slot for one second (0 for per-token prices)."""
    if price.gpu_hour is None or price.gpus is None:
        return 0.0
    return price.gpu_hour * price.gpus / 3600 / slots


def request_cost(price: PriceConfig | None, slots: int, prompt_tokens: int,
                 completion_tokens: int, slot_s: float) -> float:
    """The cost of one request from its usage and its slot time (0 with no price)."""
    if price is None:
        return 0.0
    if price.input_per_mtok is not None and price.output_per_mtok is not None:
        return (prompt_tokens * price.input_per_mtok
                + completion_tokens * price.output_per_mtok) / _MTOK
    return slot_s * slot_second_price(price, slots)


@dataclass(slots=True)
class _Sample:
    tokens: int
    seconds: float


class SlotTimeModel:
    """How long a backend holds a slot for an answer of n tokens: a least-squares line
    (seconds = a + b * n) over its last `window` requests.

    Used for the counterfactual cost on a GPU-time-priced primary of requests that ran
    elsewhere. Before two distinct lengths are seen, every answer is assumed to take
    `initial_s`.
    """

    def __init__(self, initial_s: float, window: int = 256) -> None:
        self.initial_s = initial_s
        self._samples: deque[_Sample] = deque(maxlen=window)
        self._n = 0
        self._sx = self._sy = self._sxx = self._sxy = 0.0

    def observe(self, completion_tokens: int, slot_s: float) -> None:
        if len(self._samples) == self._samples.maxlen:
            old = self._samples[0]
            self._add(old.tokens, old.seconds, -1)
        self._samples.append(_Sample(completion_tokens, slot_s))
        self._add(completion_tokens, slot_s, 1)

    def _add(self, x: float, y: float, sign: int) -> None:
        self._n += sign
        self._sx += sign * x
        self._sy += sign * y
        self._sxx += sign * x * x
        self._sxy += sign * x * y

    def predict(self, completion_tokens: int) -> float:
        n = self._n
        if n == 0:
            return self.initial_s
        mean_x, mean_y = self._sx / n, self._sy / n
        var_x = self._sxx / n - mean_x * mean_x
        if n < 2 or var_x <= 1e-9:
            return max(0.0, mean_y)
        slope = max(0.0, (self._sxy / n - mean_x * mean_y) / var_x)
        intercept = max(0.0, mean_y - slope * mean_x)
        return intercept + slope * completion_tokens
