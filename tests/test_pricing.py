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
    assert request_cost(None, 3, 1_000, 1_000, 10.0, batch=True) == 0.0


@pytest.mark.parametrize(("fields", "full"), [
    ({"input_per_mtok": 3.0, "output_per_mtok": 15.0}, 0.0135),  # the tokens'
    ({"gpu_hour": 2.4, "gpus": 4}, 4.5 * 9.6 / 3600 / 3),  # the slot time's
])
@pytest.mark.parametrize("discount", [None, 0.0, 0.2, 1.0])
def test_a_batch_line_pays_the_price_less_its_discount(
        fields: dict[str, float], full: float, discount: float | None) -> None:
    price = PriceConfig(**fields) if discount is None else PriceConfig(
        **fields, batch_discount=discount)
    assert request_cost(price, 3, 2_000, 500, slot_s=4.5) == pytest.approx(full)
    off = 0.5 if discount is None else discount  # half by default, as OpenAI charges
    assert request_cost(price, 3, 2_000, 500, slot_s=4.5, batch=True) == pytest.approx(
        full * (1 - off))


@pytest.mark.parametrize("fields", [
    {"input_per_mtok": 1.0},  # half a per-token price
    {"gpus": 2},  # half a GPU price
    {"input_per_mtok": 1.0, "output_per_mtok": 2.0, "gpu_hour": 2.0, "gpus": 1},  # both
    {},  # nothing
    {"gpu_hour": -1.0, "gpus": 1},
    {"gpu_hour": 1.0, "gpus": 1, "batch_discount": 1.5},  # more than the whole price off
    {"gpu_hour": 1.0, "gpus": 1, "batch_discount": -0.1},
    {"batch_discount": 0.5},  # a discount of no price
])
def test_invalid_prices_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        PriceConfig(**fields)
