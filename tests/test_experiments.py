"""Sticky, uniform arm assignment and how arms change a route."""

from __future__ import annotations

import collections
import math

from policies.config import ExperimentConfig, FallbackWhen, RouteConfig
from policies.pricing.experiments import Experiment, build_experiments
from tests.support import SdkClients, StartGateway, assert_idle, gateway_config, sim_backend

ROUTE = RouteConfig.model_validate({
    "primary": "big", "fallbacks": ["small"],
    "fallback": {"when": "saturated", "min_confidence": 0.8},
})


def experiment(weights: dict[str, float], name: str = "ab") -> Experiment:
    config = ExperimentConfig.model_validate(
        {"route": "chat", "arms": {arm: {"weight": w} for arm, w in weights.items()}})
    return Experiment(name, config, ROUTE)


def test_same_subject_same_arm() -> None:
    exp = experiment({"a": 1, "b": 1, "c": 1})
    for i in range(200):
        subject = f"user:{i}"
        first = exp.assign(subject).name
        assert all(exp.assign(subject).name == first for _ in range(5))
    # and across instances (another replica builds its own)
    other = experiment({"a": 1, "b": 1, "c": 1})
    assert [exp.assign(f"u{i}").name for i in range(500)] == \
        [other.assign(f"u{i}").name for i in range(500)]


def test_weights_hold_over_ten_thousand_subjects() -> None:
    weights = {"off": 1.0, "on": 3.0}  # 25% / 75%
    exp = experiment(weights)
    counts = collections.Counter(exp.assign(f"user:{i}").name for i in range(10_000))
    for arm, weight in weights.items():
        share = weight / sum(weights.values())
        sd = math.sqrt(10_000 * share * (1 - share))  # binomial: ~43 for 25%
        assert abs(counts[arm] - 10_000 * share) < 4 * sd, counts


def test_experiments_assign_independently() -> None:
    one, two = experiment({"a": 1, "b": 1}, "one"), experiment({"a": 1, "b": 1}, "two")
    pairs = collections.Counter(
        (one.assign(f"s{i}").name, two.assign(f"s{i}").name) for i in range(10_000))
    for pair in (("a", "a"), ("a", "b"), ("b", "a"), ("b", "b")):
        assert abs(pairs[pair] - 2_500) < 4 * math.sqrt(10_000 * 0.25 * 0.75), pairs


def test_no_subject_is_random_per_request() -> None:
    exp = experiment({"a": 1, "b": 1})
    counts = collections.Counter(exp.assign(None).name for _ in range(2_000))
    assert counts["a"] > 800 and counts["b"] > 800


def test_arms_override_only_what_they_name() -> None:
    config = ExperimentConfig.model_validate({"route": "chat", "arms": {
        "off": {"fallback": {"when": "never"}},
        "strict": {"fallback": {"min_confidence": 0.95}},
        "on": {},
        "spill": {"overflow": "reject", "fallbacks": ["tiny"]},
    }})
    arms = {arm.name: arm.route for arm in Experiment("x", config, ROUTE).arms}
    assert arms["on"] == ROUTE
    assert arms["off"].fallback.when is FallbackWhen.NEVER
    assert arms["off"].fallback.min_confidence == 0.8  # kept from the route
    assert arms["strict"].fallback.when is FallbackWhen.SATURATED
    assert arms["strict"].fallback.min_confidence == 0.95
    assert arms["spill"].fallbacks == ("tiny",) and arms["spill"].overflow.value == "reject"


def test_disabled_experiments_are_not_built() -> None:
    configs = {
        "live": ExperimentConfig.model_validate({"route": "chat", "arms": {"a": {}, "b": {}}}),
        "paused": ExperimentConfig.model_validate(
            {"route": "other", "enabled": False, "arms": {"a": {}, "b": {}}}),
    }
    built = build_experiments(configs, {"chat": ROUTE, "other": ROUTE})
    assert list(built) == ["chat"] and built["chat"].name == "live"


async def test_an_arm_that_steers_loads_the_classifier(
    sdk: SdkClients, start: StartGateway
) -> None:
    raw = gateway_config(sim_backend("m-big", slots=1), sim_backend("m-small", slots=1),
                         overflow="reject")  # the route itself never steers
    raw["experiments"] = {"fb": {"route": "chat", "arms": {
        "plain": {"weight": 0.001}, "steer": {"fallback": {"when": "always"}}}}}
    gw = await start(raw)
    assert gw.gateway.classifier is not None and gw.gateway.backends["small"].offers is not None
    reply = await sdk(gw).chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": "hello!"}], user="someone")
    assert reply.headers["x-slotgate-arm"] == "steer"
    assert reply.headers["x-slotgate-backend"] == "small"  # a greeting, sent to the fallback
    await assert_idle(gw)
