"""The part of a backend's clock that differs between the replicas of its group (one on
faster GPUs, a simulated engine with parameters of its own): each replica's prefill rate
and stream rates, learned from the very observation the group's clock learns from
(`policies.clock.clock.Clock.observe`). A replica's figure stands in for the group's only
once it has enough samples of its own; until then the group's is its answer. Only a
group of more than one keeps these. Pure: no I/O, no time of its own.
"""

from __future__ import annotations

from policies.clock.answers import ALPHA, Rates
from policies.clock.line import Line


class ReplicaClock:
    """One replica's own measurements: the line of its time to first token over the
    prompt tokens it prefilled, and its stream rates (time to the first token and tokens
    per second per stream, averaged as the group's are: `AnswerModel.observe`)."""

    __slots__ = ("prefill", "rate_samples", "tokens_per_s", "ttft_s")

    def __init__(self) -> None:
        self.prefill = Line(0.0)
        self.rate_samples = 0
        self.ttft_s = self.tokens_per_s = 0.0

    def observe(self, rate: float | None, ttft_s: float | None,
                prefilled: int | None) -> None:
        """One of its answers: `rate` the decode rate the group's answer model measured
        of it (None: none), `ttft_s` its stream's first token from the slot, `prefilled`
        the prompt tokens its engine prefilled (None: not reported)."""
        if ttft_s is None:
            return
        if rate is not None:
            if self.rate_samples == 0:
                self.ttft_s, self.tokens_per_s = ttft_s, rate
            else:
                self.ttft_s += ALPHA * (ttft_s - self.ttft_s)
                self.tokens_per_s += ALPHA * (rate - self.tokens_per_s)
            self.rate_samples += 1
        if prefilled is not None:
            self.prefill.observe(prefilled, ttft_s)


class ReplicaClocks:
    """A group's replicas' own measurements, by name (each begun at its first answer;
    a replica a reload removed keeps its few numbers), and the rule of when they replace
    the group's: `min_prefill` samples of the prefill line with a slope above zero,
    `min_rates` measured streams."""

    __slots__ = ("_by_name", "min_prefill", "min_rates")

    def __init__(self, min_prefill: int, min_rates: int) -> None:
        self._by_name: dict[str, ReplicaClock] = {}
        self.min_prefill, self.min_rates = min_prefill, min_rates

    def __getitem__(self, replica: str) -> ReplicaClock | None:
        return self._by_name.get(replica)

    def observe(self, replica: str, rate: float | None, ttft_s: float | None,
                prefilled: int | None) -> None:
        own = self._by_name.get(replica)
        if own is None:
            own = self._by_name[replica] = ReplicaClock()
        own.observe(rate, ttft_s, prefilled)

    def prefill_s_per_token(self, replica: str) -> float | None:
        """`replica`'s own seconds to prefill a prompt token; None until it has enough
        samples (and a slope: prompts of more than one size)."""
        own = self._by_name.get(replica)
        if own is None or len(own.prefill) < self.min_prefill:
            return None
        return own.prefill.slope() or None

    def rates(self, replica: str) -> Rates | None:
        """`replica`'s own stream rates; None until it has enough measured streams."""
        own = self._by_name.get(replica)
        if own is None or own.rate_samples < self.min_rates:
            return None
        return Rates(own.ttft_s, own.tokens_per_s)
