"""The scheduler's view of the live gateway for one decision (`pipeline.View`), and the
request's facts as its stages ask for them (`pipeline.Request`).

Each pool is read once per decision (its snapshot kept for the stages after the first
that asks); forecasts, the objective's options, the steering candidates and a group's
replica pick are worked out only when a stage asks. A re-decision makes a new view.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from classifier.text import request_text
from policies.config import RouteConfig, RouteFallbackConfig
from policies.scheduler.brevity import steering_odds
from policies.scheduler.objective import Option, qualifies
from policies.scheduler.steering import Candidate, RequestFacts
from policies.slots import PoolSnapshot
from router.exchange import Capable, Exchange
from router.placement import Preference
from router.request.options import options


class Candidates:
    """The backends of one request's route as one decision sees them (`pipeline.View`),
    and the request's facts (`pipeline.Request`): its class, the backends able to serve
    it, its objective and, asked for, the classifier's verdict. One object for both: one
    made per decision."""

    __slots__ = ("_pools", "able", "ex", "priority", "standing")

    def __init__(self, ex: Exchange, able: Capable) -> None:
        self.ex, self.able, self.priority = ex, able, ex.priority
        self.standing = ex.gw.health.standing  # each backend's, now
        self._pools: dict[str, PoolSnapshot] = {}

    def recovery_s(self, chain: Sequence[str]) -> float:
        return self.ex.gw.health.retry_in_s(list(chain))

    def pool(self, name: str) -> PoolSnapshot:
        """`name`'s pool now; to an interactive request, the slots batch lines hold there
        are free (one is given back as it takes a place: `router.waiting.carry_out`)."""
        snapshot = self._pools.get(name)
        if snapshot is None:
            snapshot = self.ex.gw.backends[name].pool.snapshot()
            given = 0 if self.ex.batch else self.ex.gw.batch_lines.count(name)
            if given:
                snapshot = replace(snapshot, active=max(0, snapshot.active - given))
            self._pools[name] = snapshot
        return snapshot

    def forecast(self, name: str, position: int) -> float:
        return self.ex.gw.backends[name].pool.forecast(position)

    def candidates(self, names: Sequence[str]) -> list[Candidate]:
        configs = self.ex.config.backends
        return [Candidate(self.pool(name), configs[name].context_window,
                          frozenset(configs[name].capabilities), configs[name].served_apis)
                for name in names]

    def options(self, route: RouteConfig) -> list[Option]:
        return options(self.ex, route)

    def place(self, name: str) -> Preference | None:
        """A group's pick (None: a backend of one endpoint, nothing to pick)."""
        ex = self.ex
        backend = ex.gw.backends[name]
        if not backend.grouped:
            ex.rec.pick = ex.rec.prefix_blocks = None  # (a retry may come from a group)
            return None
        return ex.prefer(backend)

    @property
    def objective_s(self) -> float | None:
        objective_ms = self.ex.rec.slo_ttft_ms
        return None if objective_ms is None else objective_ms / 1000

    def classified(self, rule: RouteFallbackConfig) -> RequestFacts:
        """Its intent and how likely it is simple (classified once, by `rule`'s intents)."""
        ex = self.ex
        if ex.facts is None:
            ex.facts = _classify(ex, rule)
        return ex.facts


def _classify(ex: Exchange, rule: RouteFallbackConfig) -> RequestFacts:
    gw, rec, parsed = ex.gw, ex.rec, ex.request_body
    assert gw.classifier is not None, "steering routes load the classifier at startup"
    began = time.perf_counter()
    text = request_text(parsed.body)
    prediction = gw.classifier.predict(text)
    gw.metrics.classifier.observe(time.perf_counter() - began)
    p_simple = steering_odds(prediction, rule.intents, parsed.max_tokens, text)
    facts = RequestFacts(prediction.intent, p_simple, ex.prompt_tokens(), parsed.max_tokens,
                         ex.needs().capabilities, parsed.endpoint.api)
    rec.intent, rec.p_simple = facts.intent, round(facts.p_simple, 4)
    if ex.trace is not None:
        ex.trace.classified(began, facts.intent, facts.p_simple,
                            qualifies(facts.intent, facts.p_simple, rule))
    return facts

