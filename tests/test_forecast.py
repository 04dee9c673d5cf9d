"""The progress-aware queue forecast: answer models, lengths, and the line's start times.
Plain numbers, a test clock; no network."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from policies.clock.answers import AnswerModel, Hints, Rates, hints
from policies.clock.eta import predict_waits
from policies.clock.forecast import (
    Durations,
    Progress,
    Running,
    line_starts,
    seen_here,
    start_times,
)
from policies.clock.holds import HoldTimeModel
from policies.clock.lengths import Survival, kaplan_meier, uniform
from policies.config import BackendConfig, RatesHint, SimulatedSpec
from policies.slots import LocalSlotPool

TTFT, RATE = 0.4, 30.0  # the embedded config's simulated 70B


def to_cap(ttft: float = TTFT, rate: float = RATE) -> Durations:
    """Rates known, no lengths: every answer runs to its max_tokens."""
    return Durations(AnswerModel(Hints(ttft, rate)), HoldTimeModel(10.0))


def full(max_tokens: int) -> float:
    """The hold of an answer of `max_tokens` tokens: first token, then one per 1/RATE."""
    return TTFT + (max_tokens - 1) / RATE


# -- bursts: every answer started together ----------------------------------------------

@pytest.mark.parametrize(("n", "slots"), [(10, 3), (5, 3), (4, 1), (7, 2), (3, 3)])
def test_a_burst_of_equal_answers_starts_in_waves(n: int, slots: int) -> None:
    running = [Running(0.0, 0, 80)] * slots
    waiting = [80] * (n - slots)
    got = start_times(to_cap(), running, slots, waiting, n - slots)
    expected = [full(80) * (1 + k // slots) for k in range(n - slots)]
    assert got == pytest.approx(expected)


def test_a_burst_of_unequal_answers_follows_each_ones_own_cap() -> None:
    running = [Running(0.0, 0, 40), Running(0.0, 0, 80), Running(0.0, 0, 120)]
    waiting = [40, 40, 120, 80]
    ends = sorted([full(40), full(80), full(120)])
    first = ends[0]  # place 1 takes the 40-token slot, and frees it again after full(40)
    second = ends[1]
    third = first + full(40)
    fourth = ends[2]
    got = start_times(to_cap(), running, 3, waiting, 4)
    assert got == pytest.approx([first, second, third, fourth])


def test_free_slots_serve_at_once_and_places_past_the_line_take_typical_answers() -> None:
    got = start_times(to_cap(), [Running(1.0, 10, 80)], 3, [], 4)
    assert got[:2] == [0.0, 0.0]
    assert got[2] == pytest.approx((80 - 10) / RATE)
    # no max_tokens and no known length: the holds model stands in (10 s)
    assert got[3] == pytest.approx(10.0)


def test_more_running_than_slots_after_a_cut_frees_nothing_until_the_extras_end() -> None:
    running = [Running(0.0, 0, 40), Running(0.0, 0, 80), Running(0.0, 0, 120)]
    assert start_times(to_cap(), running, 2, [80], 1) == pytest.approx([full(80)])


def test_places_far_back_follow_the_pool_rate() -> None:
    from policies.clock import forecast

    places = forecast.EXACT_PLACES + 10
    got = start_times(to_cap(), [Running(0.0, 0, 80)] * 2, 2, [80] * places, places)
    assert len(got) == places
    step = to_cap().fresh(None)  # past the exact part: the typical answer (no cap: 10 s)
    assert got[-1] - got[-2] == pytest.approx(step / 2)


# -- part-way through ---------------------------------------------------------------------

@pytest.mark.parametrize(
    ("elapsed", "tokens", "max_tokens", "expected"),
    [
        (2.7, 70, 80, 10 / RATE),  # 70 of 80 streamed: nearly done
        (0.1, 0, 80, 0.3 + 79 / RATE),  # before its first token
        (0.9, 0, 80, 79 / RATE),  # first token late: the decode still to come
        (3.0, 80, 80, 0.0),  # all out: ends now
        (3.2, 95, 80, 0.0),  # the relay's counter overshoots the cap (usage chunk): now
    ],
)
def test_a_stream_part_way_ends_after_its_tokens_left(
        elapsed: float, tokens: int, max_tokens: int, expected: float) -> None:
    assert to_cap().remaining(Running(elapsed, tokens, max_tokens)) == pytest.approx(expected)


def test_what_a_stream_has_produced_outweighs_the_average() -> None:
    model = AnswerModel(Hints(TTFT, RATE))
    for _ in range(40):  # answers average 200 tokens...
        model.observe(200, 400)
    # ...but this one may produce 80 at most and has produced 70
    assert model.remaining_s(2.7, 70, 80) == pytest.approx(10 / RATE)
    assert model.fresh_s(None) == pytest.approx(full(200))


def test_lengths_condition_on_what_is_produced() -> None:
    model = AnswerModel(Hints(TTFT, RATE))
    for length in [50] * 20 + [150] * 20:
        model.observe(length, 1000)
    assert model.fresh_s(1000) == pytest.approx(full(100))  # half short, half long
    # past 50 tokens it is one of the long ones: 100 more to go
    assert model.remaining_s(2.5, 60, 1000) == pytest.approx(90 / RATE)


@pytest.mark.parametrize(
    ("elapsed", "max_tokens", "expected"),
    [
        (0.2, 80, 0.2 + 79 / RATE),  # before its first token would have come
        (2.0, 80, (80 - (1 + 1.6 * RATE)) / RATE),  # ~49 tokens made by now (inferred)
        (9.0, 80, 0.0),  # past its whole answer's time: ends any moment
    ],
)
def test_a_non_streaming_answer_is_judged_by_its_age(
        elapsed: float, max_tokens: int, expected: float) -> None:
    assert to_cap().remaining(Running(elapsed, None, max_tokens)) == pytest.approx(expected)


# -- cold gateways --------------------------------------------------------------------------

def test_a_cold_simulated_backend_uses_its_engine_parameters() -> None:
    spec = SimulatedSpec(max_num_seqs=3, ttft_s=0.4, tokens_per_s=30, output_tokens=120,
                         output_tokens_spread=0.5)
    given = hints(BackendConfig(simulated=spec, model="m", slots=3))
    assert (given.ttft_s, given.tokens_per_s) == (0.4, 30)
    durations = Durations(AnswerModel(given), HoldTimeModel(10.0))
    # lengths 60..180: a max_tokens of 40 is always reached, one of 400 never binds
    assert durations.fresh(40) == pytest.approx(full(40))
    assert durations.fresh(400) == pytest.approx(full(120), rel=0.02)
    burst = start_times(durations, [Running(0.0, 0, 80)] * 3, 3, [80] * 7, 7)
    assert burst[0] == pytest.approx(full(80), rel=0.03)  # the engine: all end at ~3.03 s
    assert burst[3] == pytest.approx(2 * burst[0])


def test_the_rates_hint_wins_over_the_simulated_engine_and_fills_in_from_it() -> None:
    spec = SimulatedSpec(ttft_s=0.2, tokens_per_s=0, output_tokens=64)
    config = BackendConfig(simulated=spec, model="m", slots=1,
                           rates=RatesHint(tokens_per_s=50, output_tokens=100))
    given = hints(config)
    assert (given.ttft_s, given.tokens_per_s) == (0.2, 50)
    assert given.lengths is not None and given.lengths.remaining(0, None) == pytest.approx(
        100, rel=0.02)
    bare = hints(BackendConfig.model_validate({"url": "http://e:1/v1", "model": "m", "slots": 1}))
    assert bare == Hints()


def test_a_cold_gateway_without_hints_keeps_the_holding_time_forecast() -> None:
    holds, running = HoldTimeModel(10.0), [Running(2.0, 40, 80)] * 3
    got = line_starts(AnswerModel(), holds, running, 3, [80] * 4, 4)
    assert got == predict_waits(holds, [2.0] * 3, 3, 4)  # ages alone, initial_hold_s
    # once a rate is known, the answers' progress
    hinted = line_starts(AnswerModel(Hints(TTFT, RATE)), holds, running, 3, [80] * 4, 4)
    assert hinted == pytest.approx([40 / RATE] * 3 + [40 / RATE + full(80)])
    # without a length or a cap, one answer's duration comes from the holding times
    assert to_cap().fresh(None) == pytest.approx(10.0)


def test_a_replicas_own_rates_stand_in_for_the_pools() -> None:
    holds, running = HoldTimeModel(10.0), [Running(2.0, 40, 80)] * 3
    own = Rates(TTFT, RATE / 2)  # a replica on slower GPUs: half the pool's decode speed
    for answers in (AnswerModel(), AnswerModel(Hints(TTFT, RATE))):  # known or not
        got = line_starts(answers, holds, running, 3, [80] * 4, 4, own)
        assert got == pytest.approx([80 / RATE] * 3 + [80 / RATE + TTFT + 158 / RATE])


def test_without_a_length_hint_the_first_answers_measured_count() -> None:
    model = AnswerModel(Hints(TTFT, RATE))
    assert model.fresh_s(256) == pytest.approx(full(256))  # nothing known: to the cap
    model.observe(100, 256)
    assert model.fresh_s(256) == pytest.approx(full(100))
    hinted = AnswerModel(Hints(TTFT, RATE, uniform(50, 0.0)))
    hinted.observe(100, 256)  # with a hint, one answer is not enough to replace it
    assert hinted.fresh_s(256) == pytest.approx(full(50))


def test_measured_rates_replace_the_hint_then_move_slowly() -> None:
    model = AnswerModel(Hints(1.0, 10.0))
    model.observe(61, 100, ttft_s=0.5, held_s=2.5)  # 60 tokens in 2 s after the first
    assert (model.ttft_s, model.tokens_per_s) == (0.5, 30.0)
    model.observe(61, 100, ttft_s=0.5, held_s=4.5)  # 15 tokens/s: a fifth of the way
    assert model.tokens_per_s == pytest.approx(27.0)
    model.observe(1, 100, ttft_s=0.5, held_s=0.6)  # one token: no rate in it
    model.observe(10, 100, ttft_s=3.0, held_s=2.0)  # a first token after the end: ignored
    assert model.rate_samples == 2
    model.configure(Hints(2.0, 5.0))  # a reload's hints do not undo measurements
    assert model.tokens_per_s == pytest.approx(27.0)


# -- lengths --------------------------------------------------------------------------------

def test_kaplan_meier_counts_capped_answers_as_at_least_their_length() -> None:
    # four answers stopped at 10, 20, 30; two were cut at 20 (their max_tokens)
    survival = kaplan_meier([(10, False), (20, True), (20, True), (20, False), (30, False)])
    assert survival.points == (10.0, 20.0, 30.0)
    assert survival.after == pytest.approx([0.8, 0.8 * 3 / 4, 0.0])


def test_answers_capped_short_do_not_teach_that_longer_ones_stop_there() -> None:
    model = AnswerModel(Hints(TTFT, RATE))
    for _ in range(30):
        model.observe(40, 40)  # every answer so far hit its max_tokens of 40
    assert model.fresh_s(40) == pytest.approx(full(40))
    longer = model.fresh_s(120)
    assert longer is not None and longer > full(40) + 0.3  # past 40: the tail, not a wall


@pytest.mark.parametrize(
    ("survival", "produced", "cap", "expected"),
    [
        (Survival((), ()), 0, 80, 80),  # no lengths known: to the cap
        (Survival((), ()), 30, None, None),  # nor a cap: the model cannot tell
        (uniform(100, 0.0), 0, None, 100),  # a point mass
        (uniform(100, 0.0), 60, 80, 20),
        (uniform(100, 0.5), 0, None, 100),  # uniform 50..150
        (uniform(100, 0.5), 0, 50, 50),
        (uniform(100, 0.0), 120, None, 30),  # past every length seen: a quarter more
        (uniform(100, 0.0), 120, 125, 30 * -math.expm1(-5 / 30)),  # ...capped
    ],
)
def test_remaining_tokens(survival: Survival, produced: int, cap: int | None,
                          expected: float | None) -> None:
    got = survival.remaining(produced, cap)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected, rel=0.03, abs=1.1)


# -- progress: what a lease's holder feeds in ------------------------------------------------

@dataclass
class Counter:
    seen_events: int = 0


def test_progress_reads_the_relay_counter_when_asked() -> None:
    counter = Counter()
    progress = Progress(80, counter)
    counter.seen_events += 30  # what the relay does, per event
    assert progress.running(1.5) == Running(1.5, 30, 80)
    assert Progress(80).running(1.5) == Running(1.5, None, 80)  # not a stream


def test_a_shared_pool_sees_its_own_leases_progress_and_others_ages() -> None:
    mine = Progress(80, Counter(70))
    got = seen_here([4.0, 2.05, 0.5], [(2.0, mine)])
    assert got == [Running(2.0, 70, 80), Running(0.5), Running(4.0)]
    lagging = seen_here([], [(0.1, mine)])  # granted since the store's last word
    assert lagging == [Running(0.1, 70, 80)]
    # the store counts three holders, their ages not heard yet: taken as just begun
    assert seen_here([], [(0.1, mine)], held=3) == [Running(0.1, 70, 80), Running(0.0),
                                                    Running(0.0)]


async def test_the_local_pool_forecasts_from_its_leases_and_tickets() -> None:
    now = [0.0]
    answers = AnswerModel(Hints(TTFT, RATE))
    pool = LocalSlotPool("p", 2, 10, HoldTimeModel(10.0), clock=lambda: now[0],
                         answers=answers)
    a, b = pool.acquire_nowait(), pool.acquire_nowait()
    assert a is not None and b is not None
    streamed = Counter()
    a.follow(Progress(80, streamed))
    b.follow(Progress(40))  # not streamed: judged by its age
    tickets = [pool.enqueue_nowait(max_tokens=m) for m in (120, 40, 80)]
    assert all(tickets)
    now[0] += 1.0
    streamed.seen_events = 50
    pool._forecasts.clear()  # (the cache would otherwise hold for FORECAST_TTL_S)
    first = (40 - (1 + 0.6 * RATE)) / RATE  # b: 40 tokens, ~19 made by now
    second = 30 / RATE  # a: 30 tokens to go
    third = second + full(40)  # place 2's answer (40 tokens) ends before place 1's (120)
    assert [pool.forecast(p) for p in (1, 2, 3)] == pytest.approx([first, second, third])
    assert tickets[2] is not None and tickets[2].eta_s() == pytest.approx(third)
    await b.release()  # place 1 gets b's slot, with its own max_tokens
    assert tickets[0] is not None and tickets[0].position == 0
    granted = tickets[0]._granted()
    assert granted is not None and granted.progress.max_tokens == 120
    for t in tickets[1:]:
        assert t is not None
        await t.withdraw()
    await granted.release()
    await a.release()
    assert pool.active == 0 and pool.queued == 0
