"""The scheduler's stages in order, as a table: `policies.scheduler.pipeline.decide` and
`retry` over plain facts (a view of pool snapshots, standings and a group's pick), one
`Decision` per row. The live view (`router.candidates`) is exercised end to end by the
gateway's own tests; here each stage's answer and the order they are asked in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest

from policies.config import FallbackWhen, Overflow, Priority, RouteConfig, RouteFallbackConfig
from policies.scheduler.admission import RejectReason
from policies.scheduler.decision import Refuse, Run, Wait
from policies.scheduler.failover import Standing
from policies.scheduler.objective import Option, OptionKind
from policies.scheduler.pipeline import decide, in_stages, retry
from policies.scheduler.steering import Candidate, RequestFacts
from policies.slots import PoolSnapshot

UP, DOWN, PROBE = Standing.UP, Standing.DOWN, Standing.PROBE


def pool(name: str, active: int = 0, queued: int = 0, capacity: int = 2,
         queue_limit: int = 4, pinned: int = 0) -> PoolSnapshot:
    return PoolSnapshot(name, capacity, active, queued, queue_limit, 1.0, pinned=pinned)


FREE = {"big": pool("big"), "small": pool("small")}
BUSY = {"big": pool("big", active=2, queued=1), "small": pool("small")}


@dataclass
class Facts:
    """The request's facts; `asked` counts the classifier's verdicts."""

    intent: str = "greeting"
    p_simple: float = 0.97
    priority: Priority = Priority.STANDARD
    able: frozenset[str] = frozenset({"big", "small"})
    objective_s: float | None = None
    asked: int = 0

    def classified(self, rule: RouteFallbackConfig) -> RequestFacts:
        self.asked += 1
        return RequestFacts(self.intent, self.p_simple, 10, 16)


@dataclass(frozen=True)
class Placed:
    first: tuple[str, ...] = ()
    holder: str | None = None
    hold_s: float = 0.0


@dataclass
class View:
    pools: Mapping[str, PoolSnapshot]
    standings: Mapping[str, Standing] = field(default_factory=dict)
    waits: Mapping[str, float] = field(default_factory=dict)  # a newcomer's forecast wait
    placed: Mapping[str, Placed] = field(default_factory=dict)
    offered: Sequence[Option] = ()

    def standing(self, chain: Sequence[str]) -> Mapping[str, Standing]:
        return {name: self.standings.get(name, UP) for name in chain}

    def recovery_s(self, chain: Sequence[str]) -> float:
        return 7.0

    def pool(self, name: str) -> PoolSnapshot:
        return self.pools[name]

    def forecast(self, name: str, position: int) -> float:
        return self.waits.get(name, 1.0) * position

    def candidates(self, names: Sequence[str]) -> list[Candidate]:
        return [Candidate(self.pools[name], None) for name in names]

    def options(self, route: RouteConfig) -> list[Option]:
        return list(self.offered)

    def place(self, name: str) -> Placed | None:
        return self.placed.get(name)  # None: a backend of one endpoint


def route(when: FallbackWhen = FallbackWhen.NEVER,
          overflow: Overflow = Overflow.FALLBACK) -> RouteConfig:
    return RouteConfig(primary="big", fallbacks=("small",), overflow=overflow,
                       fallback=RouteFallbackConfig(when=when))


# (case, view, route, decision expected)
TABLE = [
    ("a free slot runs on the primary", View(FREE), route(), Run("big", "primary")),
    ("a full primary with room in its line: wait there",
     View(BUSY), route(overflow=Overflow.REJECT), Wait("big", "primary")),
    ("a full line overflows to a free fallback",
     View({"big": pool("big", 2, 4), "small": pool("small")}), route(),
     Run("small", "fallback:overflow")),
    ("every line full: queue_full, Retry-After from the soonest forecast",
     View({"big": pool("big", 2, 4), "small": pool("small", 2, 4)},
          waits={"big": 5.0, "small": 3.0}), route(),
     Refuse(RejectReason.QUEUE_FULL, 3.0, "big")),
    ("a sick primary gives way to its healthy fallback",
     View(FREE, {"big": DOWN}), route(), Run("small", "primary")),
    ("a sick primary whose probe is due: this request is the probe",
     View(FREE, {"big": PROBE}), route(), Run("big", "primary", probe="big")),
    ("all sick: backend_unavailable until one recovers",
     View(FREE, {"big": DOWN, "small": DOWN}), route(),
     Refuse(RejectReason.BACKEND_UNAVAILABLE, 7.0, "big",
            "Backend 'big' is unavailable and so are its route's fallbacks; retry later.")),
    ("steering: a simple request leaves a saturated primary for the small model",
     View(BUSY), route(FallbackWhen.SATURATED), Run("small", "fallback:simple:greeting:0.97")),
    ("steering: the small model full, its line shorter: wait there",
     View({"big": pool("big", 2, 2), "small": pool("small", 2, 0)},
          waits={"big": 4.0, "small": 1.0}), route(FallbackWhen.SATURATED),
     Wait("small", "fallback:simple:greeting:0.97")),
    ("steering: the small model's line longer: wait for the primary, movable",
     View({"big": pool("big", 2, 1), "small": pool("small", 2, 3)},
          waits={"big": 1.0, "small": 2.0}), route(FallbackWhen.SATURATED),
     Wait("big", "primary", movable="small")),
    ("a group's pick orders the replicas to try",
     View(FREE, placed={"big": Placed(("big-1",), "big-1")}), route(),
     Run("big", "primary", prefer=("big-1",), want="big-1")),
    ("a group's pick waits for the busy replica holding the prefix",
     View(FREE, placed={"big": Placed((), "big-0", 0.8)}), route(),
     Wait("big", "primary", want="big-0", hold_s=0.8)),
    ("a group with nothing to prefer runs on whichever replica is free",
     View(FREE, placed={"big": Placed()}), route(), Run("big", "primary")),
    ("a queued request's pick is part of the decision",
     View(BUSY, placed={"big": Placed((), "big-0")}), route(overflow=Overflow.REJECT),
     Wait("big", "primary", want="big-0")),
]


@pytest.mark.parametrize(("case", "view", "config", "expected"), TABLE,
                         ids=[row[0] for row in TABLE])
def test_decide(case: str, view: View, config: RouteConfig, expected: object) -> None:
    assert decide(Facts(), view, config) == expected


def _grid() -> list[tuple[View, RouteConfig]]:
    """Every mix of the primary's load, health and group pick with the fallback's load and
    health, under each steering rule and overflow."""
    loads = {"free": {}, "one queued": {"active": 2, "queued": 1},
             "full": {"active": 2, "queued": 4}}
    offered = (Option(OptionKind.PRIMARY, "big", 2.0, 1.0),
               Option(OptionKind.SMALL, "small", 0.5, 0.1))
    out = []
    for big in loads.values():
        for small in loads.values():
            pools = {"big": pool("big", **big), "small": pool("small", **small)}
            for standings in ({}, {"big": DOWN}, {"big": PROBE}, {"small": DOWN},
                              {"big": DOWN, "small": DOWN}):
                for placed in ({}, {"big": Placed(("big-1",), "big-1")},
                               {"big": Placed((), "big-0", 0.5)}):
                    for when in FallbackWhen:
                        for overflow in Overflow:
                            out.append((View(pools, standings, placed=placed,
                                             offered=offered), route(when, overflow)))
    return out


def test_the_free_primary_shortcut_decides_as_the_stages_do() -> None:
    """`decide` answers a healthy primary with a free slot in one step; over every row of
    the table and a grid of loads, healths, picks and rules, it answers as `in_stages`."""
    cases = [(view, config) for _, view, config, _ in TABLE] + _grid()
    for view, config in cases:
        assert decide(Facts(), view, config) == in_stages(Facts(), view, config), (view, config)
    assert len(cases) > 1000


def test_the_classifier_is_asked_only_where_its_verdict_may_change_the_outcome() -> None:
    free, busy = Facts(), Facts()
    decide(free, View(FREE), route(FallbackWhen.SATURATED))
    decide(busy, View(BUSY), route(FallbackWhen.SATURATED))
    assert (free.asked, busy.asked) == (0, 1)


def test_a_hard_request_stays_with_the_primary() -> None:
    hard = Facts(intent="code", p_simple=0.1)
    assert decide(hard, View(BUSY), route(FallbackWhen.SATURATED)) == Wait("big", "primary")


def test_gone_backends_are_left_out_then_nothing_is_left() -> None:
    facts, view = Facts(), View(FREE)
    assert decide(facts, view, route(), gone=["big"]) == Run("small", "primary")
    refused = decide(facts, view, route(), gone=["big", "small"])
    assert isinstance(refused, Refuse) and refused.reason is RejectReason.BACKEND_UNAVAILABLE
    assert refused.backend == "small"


def test_the_objective_takes_the_cheapest_option_in_time_or_sheds() -> None:
    busy = View(BUSY, offered=[Option(OptionKind.PRIMARY, "big", 9.0, 1.0),
                               Option(OptionKind.OVERFLOW, "small", 0.5, 2.0)])
    aimed = decide(Facts(objective_s=1.0), busy, route(FallbackWhen.OBJECTIVE))
    assert isinstance(aimed, Run | Wait) and aimed.backend == "small"
    late = View(BUSY, offered=[Option(OptionKind.PRIMARY, "big", 9.0, 1.0)])
    shed = decide(Facts(objective_s=1.0, priority=Priority.SHEDDABLE), late,
                  route(FallbackWhen.OBJECTIVE))
    assert isinstance(shed, Refuse) and shed.reason is RejectReason.OBJECTIVE
    assert shed.retry_in_s > 0


def test_a_retry_goes_to_the_next_backend_up_without_steering() -> None:
    facts = Facts()
    again = retry(facts, View(FREE), ("big", "small"), "big", retrying=0, running=4,
                  sibling=False)
    assert again == Run("small", "retry:big")
    assert facts.asked == 0
    assert retry(facts, View(FREE, {"small": DOWN}), ("big", "small"), "big", 0, 4,
                 sibling=False) is None


def test_a_retry_stays_on_a_group_with_a_sibling_replica() -> None:
    again = retry(Facts(), View(FREE, placed={"big": Placed(("big-1",))}), ("big", "small"),
                  "big", retrying=0, running=4, sibling=True)
    assert again == Run("big", "retry:big", prefer=("big-1",))


def test_retries_are_bounded_by_the_budget() -> None:
    assert retry(Facts(), View(FREE), ("big", "small"), "big", retrying=3, running=4,
                 sibling=False) is None
