"""Cost arithmetic for both kinds of price, and the slot-time model behind counterfactuals."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from policies.config import PriceConfig
from policies.pricing.costs import request_cost, slot_second_price


def test_per_token_cost() -> None:
    price = PriceConfig(input_per_mtok=3.0, output_per_mtok=15.0)
    # 2,000 in at $3/M = $0.006; 500 out at $15/M = $0.0075
    assert request_cost(price, 8, 2_000, 500, slot_s=99.0) == pytest.approx(0.0135)
    assert slot_second_price(price, 8) == 0.0  # slot time is free on a per-token price


def test_gpu_time_cost() -> None:
    price = PriceConfig(gpu_hour=2.4, gpus=4)
    # $2.40 x 4 GPUs = $9.60/h = $0.002667/s for the engine; 3 slots share it
    assert slot_second_price(price, 3) == pytest.approx(9.6 / 3600 / 3)
    # 4.5 s holding one of 3 slots: 4.5 x 0.000888... = $0.004
    assert request_cost(price, 3, 10_000, 10_000, slot_s=4.5) == pytest.approx(0.004)
    assert request_cost(price, 3, 0, 0, slot_s=0.0) == 0.0


def test_no_price_is_free() -> None:
    assert request_cost(None, 3, 1_000, 1_000, 10.0) == 0.0


@pytest.mark.parametrize("fields", [
    {"input_per_mtok": 1.0},  # half a per-token price
    {"gpus": 2},  # half a GPU price
    {"input_per_mtok": 1.0, "output_per_mtok": 2.0, "gpu_hour": 2.0, "gpus": 1},  # both
    {},  # nothing
    {"gpu_hour": -1.0, "gpus": 1},
])
def test_invalid_prices_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        PriceConfig(**fields)
