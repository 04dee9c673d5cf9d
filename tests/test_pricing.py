"""Cost arithmetic for both kinds of price, and the slot-time model behind counterfactuals."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from policies.config import PriceConfig
from policies.pricing.costs import SlotTimeModel, request_cost, slot_second_price


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


def test_slot_time_model_learns_a_line() -> None:
    model = SlotTimeModel(initial_s=7.0)
    assert model.predict(100) == 7.0  # nothing measured yet
    for tokens in (10, 50, 100, 200):
        model.observe(tokens, 0.5 + tokens * 0.02)  # 0.5 s to the first token, 50 tokens/s
    assert model.predict(300) == pytest.approx(0.5 + 300 * 0.02)
    assert model.predict(0) == pytest.approx(0.5)


def test_slot_time_model_window_forgets() -> None:
    model = SlotTimeModel(initial_s=1.0, window=4)
    for tokens in (10, 20, 30, 40):
        model.observe(tokens, tokens * 1.0)  # 1 s per token
    for tokens in (10, 20, 30, 40):
        model.observe(tokens, tokens * 0.1)  # the engine got 10x faster
    assert model.predict(100) == pytest.approx(10.0)


def test_slot_time_model_one_length_uses_the_mean() -> None:
    model = SlotTimeModel(initial_s=1.0)
    model.observe(64, 2.0)
    model.observe(64, 4.0)
    assert model.predict(640) == pytest.approx(3.0)
