"""pick: which replica of a group takes a request (snapshot in, choice out), for every mode
and reason; and, whatever the snapshot, a choice that is free, healthy and within the
bound unless nothing lighter is free."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.scheduler.pick import (
    EPSILON,
    Pick,
    PickMode,
    PickReason,
    Replica,
    bound,
    hold_out,
    pick,
    rendezvous,
    session_key,
)
from policies.scheduler.prefix import NO_MATCH, Match

AFFINITY, LEAST, ROBIN = PickMode.AFFINITY, PickMode.LEAST_LOADED, PickMode.ROUND_ROBIN
TWO = PickMode.POWER_OF_TWO
PREFIX, SESSION, LEAST_LOADED, ROUND_ROBIN, BOUND = (
    PickReason.PREFIX, PickReason.SESSION, PickReason.LEAST_LOADED, PickReason.ROUND_ROBIN,
    PickReason.BOUND)


def r(name: str, load: int = 0, *, active: int = 0, slots: int = 2, healthy: bool = True,
      penalty: float = 0.0) -> Replica:
    return Replica(name, slots, active, load, healthy, penalty)


def busy(name: str, load: int = 0) -> Replica:
    return r(name, load, active=2)


def down(name: str, load: int = 0) -> Replica:
    return r(name, load, healthy=False)


TABLE_EPSILON = 0.25  # the table's bound: a quarter over the mean (the default allows twice)

# "carol" ranks c, a, b; "bob" ranks c, b, a; "alice" ranks a first (rendezvous over a, b, c).
ABC = [r("a"), r("b"), r("c")]


@pytest.mark.parametrize(
    ("replicas", "tokens", "options", "expected"),
    [
        # Nothing free: the caller queues.
        ([], 10, {}, None),
        ([busy("a"), busy("b")], 10, {}, None),
        ([down("a"), busy("b")], 10, {}, None),
        ([r("a", 0, slots=0)], 10, {}, None),
        # Least loaded: fewer tokens in flight wins, whatever the busy slots.
        ([r("a", 300), r("b", 100, active=1), r("c", 200)], 10, {}, ("b", LEAST_LOADED)),
        ([r("a", 300), r("b", 100, active=1), r("c", 200)], 10, {"mode": LEAST},
         ("b", LEAST_LOADED)),
        # ... but only among the free and healthy.
        ([r("a", 300), busy("b", 0), down("c", 0)], 10, {}, ("a", LEAST_LOADED)),
        # Ties: the lowest name, whatever the snapshot's order.
        ([r("b", 100), r("a", 100), r("c", 100)], 10, {}, ("a", LEAST_LOADED)),
        # The penalty breaks a tie, weighs the load (full pressure counts twice)...
        ([r("a", 100, penalty=0.5), r("b", 100, penalty=0.1)], 10, {}, ("b", LEAST_LOADED)),
        ([r("a", 100, penalty=1.0), r("b", 150)], 10, {"epsilon": 9}, ("b", LEAST_LOADED)),
        ([r("a", 100, penalty=0.2), r("b", 150)], 10, {"epsilon": 9}, ("a", LEAST_LOADED)),
        # ... and overrides neither a busy slot nor the bound: b is lighter weighed, over it.
        ([r("a", 0, penalty=1.0), busy("b", 0)], 10, {}, ("a", LEAST_LOADED)),
        ([r("a", 100, penalty=1.0), r("b", 160)], 10, {}, ("a", LEAST_LOADED)),
        # Prefix: the replica holding the longest prefix, though not the least loaded.
        ([r("a", 100), r("b", 120)], 10, {"prefix": Match("b", 3)}, ("b", PREFIX)),
        # ... ahead of the session's replica.
        (ABC, 10, {"prefix": Match("a", 1), "session": "carol"}, ("a", PREFIX)),
        # An idle group: every replica is the least loaded, affinity holds.
        (ABC, 1000, {"prefix": Match("b", 1)}, ("b", PREFIX)),
        # Bound: b with the request (1010) over 1.25 x mean (1010 / 2): least loaded instead.
        ([r("a", 0), r("b", 1000)], 10, {"prefix": Match("b", 9)}, ("a", BOUND)),
        # Exactly at the bound is within it: (300 + 450 + 50) / 2 x 1.25 = 500 = 450 + 50.
        ([r("a", 300), r("b", 450)], 50, {"prefix": Match("b", 1)}, ("b", PREFIX)),
        ([r("a", 300), r("b", 451)], 50, {"prefix": Match("b", 1)}, ("a", BOUND)),
        # ... unless what b holds spares it the prefill: it adds only the rest (50 - 2).
        ([r("a", 300), r("b", 451)], 50, {"prefix": Match("b", 1), "warm_tokens": 2},
         ("b", PREFIX)),
        ([r("a", 300), r("b", 451)], 50, {"prefix": Match("b", 1), "warm_tokens": 500},
         ("b", PREFIX)),  # (never less than nothing)
        ([r("a", 300), r("b", 451)], 50, {"session": "bob", "warm_tokens": 40},
         ("a", BOUND)),  # warm tokens count only where the prefix is
        ([r("a", 100), r("b", 150)], 40, {"prefix": Match("b", 1), "epsilon": 0.0},
         ("a", BOUND)),
        # The mean counts busy healthy replicas (here it lets b stay), never unhealthy ones.
        ([r("a", 0), r("b", 100), busy("c", 200)], 10, {"prefix": Match("b", 1)},
         ("b", PREFIX)),
        ([r("a", 0), r("b", 100), down("c", 10**6)], 10, {"prefix": Match("b", 1)},
         ("a", BOUND)),
        # Every free replica over the bound (the busy one is idle): the lightest may stay.
        ([r("a", 100), r("b", 100), busy("c", 0)], 10, {"prefix": Match("b", 1),
                                                               "epsilon": 0.0}, ("b", PREFIX)),
        ([r("a", 100), r("b", 101), busy("c", 0)], 10, {"prefix": Match("b", 1),
                                                               "epsilon": 0.0}, ("a", BOUND)),
        # The prefix's replica busy, unhealthy or gone: the session, else least loaded.
        ([r("a", 50), busy("b")], 10, {"prefix": Match("b", 4)}, ("a", LEAST_LOADED)),
        ([r("a", 50), down("b")], 10, {"prefix": Match("b", 4)}, ("a", LEAST_LOADED)),
        ([r("a", 50), r("b")], 10, {"prefix": Match("z", 4)}, ("b", LEAST_LOADED)),
        ([r("a"), busy("b"), r("c")], 10, {"prefix": Match("b", 4), "session": "carol"},
         ("c", SESSION)),
        # No prefix known: NO_MATCH, or a match of no block, is ignored.
        ([r("a", 50), r("b")], 10, {"prefix": NO_MATCH}, ("b", LEAST_LOADED)),
        ([r("a", 50), r("b")], 10, {"prefix": Match("a", 0)}, ("b", LEAST_LOADED)),
        # Session: the key's replica, the next of its ranking when that one is busy.
        (ABC, 10, {"session": "carol"}, ("c", SESSION)),
        (ABC, 10, {"session": "alice"}, ("a", SESSION)),
        ([r("a"), r("b"), busy("c")], 10, {"session": "carol"}, ("a", SESSION)),
        ([r("a"), r("b"), down("c")], 10, {"session": "bob"}, ("b", SESSION)),
        # ... subject to the bound like a prefix.
        ([r("a", 0), r("b", 0), r("c", 500)], 10, {"session": "carol"}, ("a", BOUND)),
        # least_loaded ignores prefix and session.
        ([r("a", 100), r("b", 120)], 10, {"mode": LEAST, "prefix": Match("b", 3),
                                          "session": "bob"}, ("a", LEAST_LOADED)),
        # Round robin: from the cursor on, in snapshot order, wrapping, skipping the busy.
        (ABC, 10, {"mode": ROBIN}, ("a", ROUND_ROBIN)),
        (ABC, 10, {"mode": ROBIN, "cursor": 1}, ("b", ROUND_ROBIN)),
        (ABC, 10, {"mode": ROBIN, "cursor": 5}, ("c", ROUND_ROBIN)),
        ([r("a"), busy("b"), down("c")], 10, {"mode": ROBIN, "cursor": 1},
         ("a", ROUND_ROBIN)),
        ([r("a"), r("b")], 10, {"mode": ROBIN, "prefix": Match("b", 1), "session": "carol"},
         ("a", ROUND_ROBIN)),
        # ... and the bound: its turn too hot, the least loaded instead.
        ([r("a", 1000), r("b", 0)], 10, {"mode": ROBIN}, ("b", BOUND)),
        # Power of two: of two free replicas, both drawn, the lighter; never a busy one.
        ([r("a", 300), r("b", 100)], 10, {"mode": TWO}, ("b", PickReason.POWER_OF_TWO)),
        ([r("a", 300), busy("b", 0), down("c", 0)], 10, {"mode": TWO},
         ("a", PickReason.POWER_OF_TWO)),
    ],
)
def test_the_choice(replicas: list[Replica], tokens: int, options: dict[str, object],
                    expected: tuple[str, PickReason] | None) -> None:
    options = {"epsilon": TABLE_EPSILON, **options}
    chosen = pick(replicas, tokens, **options)  # type: ignore[arg-type]
    assert (None if chosen is None else (chosen.replica, chosen.reason)) == expected


def test_power_of_two_spreads_its_draws_and_never_takes_the_heaviest() -> None:
    group = [r("a", 0), r("b", 100), r("c", 200), r("d", 300)]
    chosen: collections.Counter[str] = collections.Counter()
    for cursor in range(400):
        got = pick(group, 10, mode=TWO, cursor=cursor, epsilon=9)
        assert got is not None and got.reason is PickReason.POWER_OF_TWO
        chosen[got.replica] += 1
    assert set(chosen) == {"a", "b", "c"}  # d loses every draw it is in
    assert chosen["a"] > chosen["b"] > chosen["c"]  # a wins all three of its pairs


def test_the_cursor_is_the_position_after_the_choice() -> None:
    group = [r("a"), busy("b"), r("c")]
    seen, cursor = [], 0
    for _ in range(4):
        chosen = pick(group, 10, mode=ROBIN, cursor=cursor)
        assert chosen is not None
        seen.append(chosen.replica)
        cursor = chosen.cursor
    assert seen == ["a", "c", "a", "c"]
    assert pick(group, 10, prefix=Match("c", 2)) == Pick("c", PREFIX, 3)


def test_the_bound_is_the_healthy_mean_with_the_request_times_one_plus_epsilon() -> None:
    group = [r("a", 100), busy("b", 300), down("c", 10**6)]
    assert bound(group, 200, 0.5) == pytest.approx(1.5 * 600 / 2)
    assert bound([down("a")], 100, EPSILON) == pytest.approx((1 + EPSILON) * 100)


def test_session_key_is_the_header_else_the_user() -> None:
    assert session_key("s-1", "carol") == "s-1"
    assert session_key(None, "carol") == "carol"
    assert session_key("", "carol") == "carol"
    assert session_key(None, "") is None
    assert session_key(None, 42) is None
    assert session_key(None, None) is None


def test_rendezvous_moves_only_the_keys_of_a_replica_that_leaves() -> None:
    names = [f"replica-{i}" for i in range(8)]
    keys = [f"session-{i}" for i in range(2000)]
    before = {key: rendezvous(key, names) for key in keys}
    assert before == {key: rendezvous(key, names[::-1]) for key in keys}  # order-free
    counts = collections.Counter(before.values())
    assert set(counts) == set(names) and min(counts.values()) > 2000 / 8 / 2
    after = {key: rendezvous(key, names[1:]) for key in keys}
    assert {key for key in keys if after[key] != before[key]} == {
        key for key in keys if before[key] == names[0]}


NAMES = "abcdefgh"


@st.composite
def snapshots(draw: st.DrawFn) -> list[Replica]:
    count = draw(st.integers(0, len(NAMES)))
    names = draw(st.permutations(NAMES))[:count]
    group = []
    for name in names:
        slots = draw(st.integers(0, 4))
        group.append(Replica(name, slots, draw(st.integers(0, slots)),
                             draw(st.integers(0, 10_000)), draw(st.booleans()),
                             draw(st.sampled_from([0.0, 0.0, 0.3, 1.0]))))
    return group


@settings(max_examples=1000, deadline=None)
@given(group=snapshots(), tokens=st.integers(0, 5000), mode=st.sampled_from(PickMode),
       held=st.one_of(st.none(), st.sampled_from(NAMES + "z")), blocks=st.integers(0, 3),
       session=st.one_of(st.none(), st.text(max_size=8)),
       epsilon=st.sampled_from([0.0, 0.1, 0.25, 1.0]), cursor=st.integers(0, 100))
def test_whatever_the_snapshot_the_choice_is_free_healthy_and_within_the_bound(
        group: list[Replica], tokens: int, mode: PickMode, held: str | None, blocks: int,
        session: str | None, epsilon: float, cursor: int) -> None:
    warm = blocks * 64
    chosen = pick(group, tokens, mode=mode, prefix=Match(held, blocks), session=session,
                  epsilon=epsilon, cursor=cursor, warm_tokens=warm)
    free = [replica for replica in group if replica.healthy and replica.active < replica.slots]
    if not free:
        assert chosen is None
        return
    assert chosen is not None
    replica = group[chosen.cursor - 1]
    assert replica.name == chosen.replica and replica in free
    adds = max(0, tokens - warm) if chosen.reason is PREFIX else tokens  # warm: less work
    # Within the bound, or no heavier than the least loaded free replica would be with it
    # (a warm prefix may keep its replica there: it adds less than the whole request).
    cap = max(bound(group, tokens, epsilon), min(other.load_tokens for other in free) + tokens)
    assert replica.load_tokens + adds <= cap + 1e-9
    if chosen.reason is PREFIX:
        assert mode is AFFINITY and blocks and chosen.replica == held
    if chosen.reason is SESSION:
        assert session is not None and chosen.replica == rendezvous(
            session, [other.name for other in free])
    assert pick(group, tokens, mode=mode, prefix=Match(held, blocks), session=session,
                epsilon=epsilon, cursor=cursor, warm_tokens=warm) == chosen  # deterministic


# hold_out: wait for the busy replica that holds the prefix, or run elsewhere now.
HELD = Match("a", 10)


@pytest.mark.parametrize(("replicas", "prefix", "saving", "holder_wait", "other", "held"), [
    # its slot comes before a cold prefill elsewhere would end: it waits, patience = saving
    ([busy("a", 100), r("b", 100)], HELD, 1.0, 0.2, 0.0, ("a", 1.0, 0.2)),
    # later than the cold prefill elsewhere: it runs elsewhere
    ([busy("a", 100), r("b", 100)], HELD, 1.0, 1.5, 0.0, None),
    # nothing free anywhere: the patience adds the group's next slot
    ([busy("a", 100), busy("b", 100)], HELD, 1.0, 1.2, 0.5, ("a", 1.5, 1.2)),
    # the holder free (the pick takes it), sick, or unknown: no wait
    ([r("a", 100), r("b", 100)], HELD, 1.0, 0.0, 0.0, None),
    ([r("a", 100, active=2, healthy=False), r("b", 100)], HELD, 1.0, 0.1, 0.0, None),
    ([busy("a", 100), r("b", 100)], NO_MATCH, 1.0, 0.1, 0.0, None),
    # nothing to save: no wait
    ([busy("a", 100), r("b", 100)], HELD, 0.0, 0.1, 0.0, None),
    # the holder over the bound with the request: no wait, however soon its slot
    ([busy("a", 10_000), r("b", 0), r("c", 0)], HELD, 1.0, 0.01, 0.0, None),
])
def test_a_request_waits_for_its_prefix_only_when_that_is_sooner(
    replicas: list[Replica], prefix: Match, saving: float, holder_wait: float, other: float,
    held: tuple[str, float, float] | None,
) -> None:
    hold = hold_out(replicas, 100, prefix, 50, saving, lambda: holder_wait, other)
    assert (None if hold is None else (hold.replica, hold.patience_s, hold.eta_s)) == held


def test_a_crowded_group_counts_a_cold_prefill_for_every_waiter_it_delays() -> None:
    group = [busy("a", 100), busy("b", 100)]  # nothing free; 2 waiters per slot behind
    assert hold_out(group, 100, HELD, 50, 1.0, lambda: 2.5, 0.5) is None
    hold = hold_out(group, 100, HELD, 50, 1.0, lambda: 2.5, 0.5, crowd=2.0)
    assert hold is not None and (hold.replica, hold.patience_s) == ("a", 3.5)


def test_the_holders_wait_is_not_forecast_when_it_cannot_be_waited_for() -> None:
    def never() -> float:
        raise AssertionError("forecast asked")

    assert hold_out([r("a"), r("b")], 100, HELD, 50, 1.0, never, 0.0) is None
    assert hold_out([busy("a"), r("b")], 100, NO_MATCH, 50, 1.0, never, 0.0) is None
