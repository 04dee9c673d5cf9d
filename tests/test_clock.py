"""One clock per backend: one observation of a finished answer teaches every part (holds,
rates and lengths, slot time by length, the prefill rate); the line under slot time and
prefill learns, forgets, and falls back to the mean or its prior."""

from __future__ import annotations

import pytest

from policies.clock.answers import Hints
from policies.clock.clock import (
    MIN_PREFILL_SAMPLES,
    MIN_RATE_SAMPLES,
    PREFILL_PRIOR_S_PER_TOKEN,
    Answered,
    Clock,
)
from policies.clock.line import Line
from tests.support import SdkClients, StartGateway, assert_idle, gateway_config, sim_backend


def test_a_line_learns_its_slope_and_intercept() -> None:
    line = Line(initial=7.0)
    assert line.predict(100) == 7.0 and line.slope() is None  # nothing measured yet
    for tokens in (10, 50, 100, 200):
        line.observe(tokens, 0.5 + tokens * 0.02)  # 0.5 s to the first token, 50 tokens/s
    assert line.predict(300) == pytest.approx(0.5 + 300 * 0.02)
    assert line.predict(0) == pytest.approx(0.5)
    assert line.slope() == pytest.approx(0.02)


def test_a_line_forgets_past_its_window() -> None:
    line = Line(initial=1.0, window=4)
    for tokens in (10, 20, 30, 40):
        line.observe(tokens, tokens * 1.0)  # 1 s per token
    for tokens in (10, 20, 30, 40):
        line.observe(tokens, tokens * 0.1)  # the engine got 10x faster
    assert line.predict(100) == pytest.approx(10.0)
    assert len(line) == 4


def test_a_line_of_one_x_is_its_mean() -> None:
    line = Line(initial=1.0)
    line.observe(64, 2.0)
    line.observe(64, 4.0)
    assert line.predict(640) == pytest.approx(3.0) and line.slope() is None


def test_one_observation_teaches_every_part() -> None:
    clock = Clock(initial_hold_s=9.0, given=Hints(ttft_s=1.0, tokens_per_s=10.0))
    assert (clock.holds.mean_s, clock.slot_s(100)) == (9.0, 9.0)
    clock.observe(Answered(2.0, max_tokens=64, tokens=41, ttft_s=0.4, whole=True,
                           prefilled=500))
    assert clock.holds.mean_s == 2.0  # the hold
    assert clock.answers.ttft_s == 0.4  # the first measured rate replaces the hint
    assert clock.answers.tokens_per_s == pytest.approx(40 / 1.6)
    assert len(clock.answers.lengths) == 1
    assert clock.slot_s(41) == 2.0  # slot time by length


def test_a_hold_without_an_answer_teaches_only_the_hold() -> None:
    clock = Clock(initial_hold_s=9.0)
    clock.observe(Answered(0.3))  # an embedding, or a request that failed
    assert clock.holds.mean_s == 0.3
    assert len(clock.answers.lengths) == 0 and clock.slot_s(10) == 9.0


def test_a_cut_answer_is_no_slot_time_sample() -> None:
    clock = Clock(initial_hold_s=9.0)
    clock.observe(Answered(1.0, tokens=5, cut=True, whole=False))
    assert clock.slot_s(5) == 9.0
    assert len(clock.answers.lengths) == 1  # at least that long


def test_the_prefill_rate_is_learned_from_first_tokens_over_prefilled_tokens() -> None:
    clock = Clock(initial_hold_s=1.0, given=Hints(prefill_s_per_token=0.01))
    assert clock.prefill_s_per_token == 0.01  # the hint until learned
    assert Clock(1.0).prefill_s_per_token == PREFILL_PRIOR_S_PER_TOKEN  # else the prior
    for i in range(MIN_PREFILL_SAMPLES):
        prefilled = 100 + 50 * i
        clock.observe(Answered(2.0, tokens=10, ttft_s=0.02 + prefilled * 0.0005,
                               prefilled=prefilled))
        learned = i + 1 >= MIN_PREFILL_SAMPLES
        assert (clock.prefill_s_per_token == pytest.approx(0.0005)) is learned


async def test_a_backend_learns_its_prefill_rate_from_the_engines_cached_tokens(
    sdk: SdkClients, start: StartGateway
) -> None:
    """The engine's usage reports the prompt tokens its prefix cache held (as vLLM's does);
    the backend's clock takes the time to first token over the tokens prefilled."""
    truth = 0.0002  # s per prompt token the engine prefills
    sim = {"ttft_s": 0.005, "prefill_s_per_token": truth, "prefix_cache_tokens": 100_000,
           "tokens_per_s": 0, "output_tokens": 2}
    gw = await start(gateway_config(sim_backend("m", slots=1, sim=sim)))
    clock = gw.gateway.backends["big"].clock
    client = sdk(gw)
    assert clock.prefill_s_per_token == truth  # the simulated engine's own figure, hinted
    for i in range(MIN_PREFILL_SAMPLES):
        words = "tell me about slots " * (20 + 60 * i)  # prompts of ~100 to ~3,500 tokens
        stream = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": words}], stream=True,
            stream_options={"include_usage": True})
        async for _ in stream:
            pass
    recent = list(gw.gateway.recent)
    assert all(r.cached_tokens is not None for r in recent)
    learned = clock.prefill_s_per_token
    assert learned != truth and truth / 2 < learned < truth * 2
    await assert_idle(gw)


# The replicas of a group: each learns its own prefill rate and stream rates from the same
# observation, and stands on the group's until it has enough samples of its own.

GROUP_HINT = Hints(ttft_s=0.5, tokens_per_s=20.0, prefill_s_per_token=0.001)


def prefill_samples(clock: Clock, replica: str | None, s_per_token: float, n: int,
                    sizes: int = 2) -> None:
    """`n` streams on `replica` whose first token took `s_per_token` per prefilled token
    (prompts of `sizes` different lengths: one size gives no slope)."""
    for i in range(n):
        prefilled = 100 + 200 * (i % sizes)
        clock.observe(Answered(1.0, tokens=1, ttft_s=0.01 + prefilled * s_per_token,
                               prefilled=prefilled), replica)


@pytest.mark.parametrize(("grouped", "on", "samples", "sizes", "asked", "own"), [
    (True, "a", MIN_PREFILL_SAMPLES, 2, "a", True),  # enough: its own
    (True, "a", MIN_PREFILL_SAMPLES - 1, 2, "a", False),  # one short: the group's
    (True, "a", MIN_PREFILL_SAMPLES, 1, "a", False),  # one prompt size: no slope
    (True, "a", MIN_PREFILL_SAMPLES, 2, "b", False),  # another replica's samples
    (True, "a", MIN_PREFILL_SAMPLES, 2, None, False),  # no replica named
    (True, None, MIN_PREFILL_SAMPLES, 2, "a", False),  # samples of no replica
    (False, "a", MIN_PREFILL_SAMPLES, 2, "a", False),  # a group of one keeps none
])
def test_a_replica_learns_its_own_prefill_rate_else_the_groups(
    grouped: bool, on: str | None, samples: int, sizes: int, asked: str | None, own: bool,
) -> None:
    clock = Clock(1.0, GROUP_HINT, grouped=grouped)
    assert clock.prefill_on(asked) == 0.001  # nothing measured: the group's hint
    prefill_samples(clock, "z", 0.001, MIN_PREFILL_SAMPLES)  # another replica, 10x slower
    prefill_samples(clock, on, 0.0001, samples, sizes)
    group = clock.prefill_s_per_token  # learned from every sample, wherever it ran
    assert group != pytest.approx(0.0001) and group != 0.001
    assert clock.prefill_on(asked) == (pytest.approx(0.0001) if own else group)


def stream_samples(clock: Clock, replica: str | None, ttft_s: float, tokens_per_s: float,
                   n: int) -> None:
    """`n` streams of 11 tokens on `replica` at these rates."""
    for _ in range(n):
        clock.observe(Answered(ttft_s + 10 / tokens_per_s, tokens=11, ttft_s=ttft_s),
                      replica)


@pytest.mark.parametrize(("grouped", "on", "samples", "asked", "own"), [
    (True, "a", MIN_RATE_SAMPLES, "a", True),
    (True, "a", MIN_RATE_SAMPLES - 1, "a", False),
    (True, "a", MIN_RATE_SAMPLES, "b", False),
    (True, "a", MIN_RATE_SAMPLES, None, False),
    (False, "a", MIN_RATE_SAMPLES, "a", False),
])
def test_a_replica_learns_its_own_stream_rates_else_the_groups(
    grouped: bool, on: str | None, samples: int, asked: str | None, own: bool,
) -> None:
    clock = Clock(1.0, GROUP_HINT, grouped=grouped)
    stream_samples(clock, "z", 0.2, 50.0, 1)  # the group's first measure: 0.2 s, 50/s
    stream_samples(clock, on, 0.1, 100.0, samples)  # then this replica's, twice as fast
    mine, group = (0.1, 100.0), (clock.answers.ttft_s, clock.answers.tokens_per_s)
    assert group != pytest.approx(mine)
    rates = clock.rates_on(asked)
    assert rates is not None
    assert tuple(rates) == pytest.approx(mine if own else group)


def test_without_a_hint_or_a_stream_no_rates_are_known() -> None:
    clock = Clock(1.0, grouped=True)
    assert clock.rates_on("a") is None
    stream_samples(clock, "a", 0.1, 100.0, 1)  # one stream: the group's, not yet its own
    rates = clock.rates_on("a")
    assert rates is not None and tuple(rates) == pytest.approx((0.1, 100.0))


def test_two_replicas_ten_times_apart_each_learn_their_own_and_the_group_lies_between() -> None:
    clock = Clock(1.0, GROUP_HINT, grouped=True)
    for _ in range(MIN_PREFILL_SAMPLES // 2):  # interleaved, as a group's requests run
        prefill_samples(clock, "slow", 0.001, 2)
        prefill_samples(clock, "fast", 0.0001, 2)
    slow, fast, group = (clock.prefill_on("slow"), clock.prefill_on("fast"),
                         clock.prefill_s_per_token)
    assert slow == pytest.approx(0.001) and fast == pytest.approx(0.0001)
    assert fast < group < slow


@pytest.mark.parametrize(("before", "after", "kept"), [
    (True, True, True),  # a reload of a group keeps what its replicas learned
    (True, False, False),  # down to one endpoint: nothing kept per replica
    (False, True, False),  # up to a group: the replicas begin to learn
])
def test_a_reload_regroups_the_replicas_parts(before: bool, after: bool, kept: bool) -> None:
    clock = Clock(1.0, GROUP_HINT, grouped=before)
    prefill_samples(clock, "a", 0.0001, MIN_PREFILL_SAMPLES)
    clock.configure(GROUP_HINT, grouped=after)
    assert (clock.replicas is None) is not after
    own = clock.replicas is not None and clock.replicas.prefill_s_per_token("a") is not None
    assert own is kept
