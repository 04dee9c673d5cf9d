"""One backend's clock: how long its answers take, learned once per finished answer
(`observe`), read by everything that asks about time. Pure: no I/O, no time of its own.

    holds       how long a slot is held (the recent holds, per max_tokens bucket): a
                running lease's residual, the queue forecast before the rates are known
                (`policies.clock.eta`)
    answers     time to the first token, tokens per second per stream, the lengths
                answers run to: the progress-aware queue forecast (`forecast`), the TTFT
                predictions (`ttft`), an option's expected answer (`policies.clock.answers`)
    slot_s      the slot an answer of n tokens holds: a line over the recent whole
                answers (an option's cost and the counterfactual cost on a GPU-time-priced
                primary, a quota's reservation)
    prefill_s_per_token   seconds to prefill one prompt token: the slope of the time to
                first token over the prompt tokens the engine prefilled (its usage's
                cached tokens taken off), until learned the `rates` hint or the prior:
                what a replica's prefix cache saves a request (`policies.scheduler.pick`)
    replicas    a group of more than one only: each replica's own prefill rate and stream
                rates (`policies.clock.replica`), from the same observation, the group's
                standing in until it has enough samples (`prefill_on`, `rates_on`): the
                prefill a cold start on that replica costs, the wait for a slot on it
                (`router.placement`). A backend of one endpoint keeps and pays nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.clock.answers import AnswerModel, Hints, Rates
from policies.clock.holds import HoldTimeModel
from policies.clock.line import Line
from policies.clock.replica import ReplicaClocks

MIN_PREFILL_SAMPLES = 16  # streams with reported cached tokens before the slope is trusted
MIN_RATE_SAMPLES = 8  # a replica's measured streams before its rates replace the group's
# Seconds to prefill one prompt token, until learned or hinted (`rates.prefill_tokens_per_s`):
# 10,000 tokens/s, the order of a 70B model's prefill on one 8-GPU node.
PREFILL_PRIOR_S_PER_TOKEN = 1e-4


# Not frozen, though never changed once made: one is made for every request, and a frozen
# dataclass sets each field through object.__setattr__ (a Run: 0.92 -> 0.24 us to make).
@dataclass(slots=True)
class Answered:
    """What one request that held a slot tells its backend's clock."""

    held_s: float  # how long it held its slot
    max_tokens: int | None = None
    tokens: int | None = None  # its answer's length (None: no answer to learn from)
    cut: bool = False  # stopped early (its client left): at least `tokens` long
    ttft_s: float | None = None  # a stream's first token, from its slot
    whole: bool = False  # a whole answer with the engine's own counts (a slot-time sample)
    prefilled: int | None = None  # prompt tokens the engine prefilled (None: not reported)


class Clock:
    """One backend's time, learned online (shared by its pools and every estimate);
    `grouped`: a group of more than one replica, whose replicas' own parts it keeps."""

    __slots__ = ("_prefill", "_slot", "answers", "holds", "replicas")

    def __init__(self, initial_hold_s: float, given: Hints | None = None,
                 grouped: bool = False) -> None:
        self.holds = HoldTimeModel(initial_hold_s)
        self.answers = AnswerModel(given)
        self._slot = Line(initial_hold_s)
        self._prefill = Line(0.0)
        self.replicas: ReplicaClocks | None = None
        self.regroup(grouped)

    def configure(self, given: Hints, grouped: bool | None = None) -> None:
        """New hints (a reload): they stand until measurements replace them; `grouped`
        (None: unchanged) as `regroup`."""
        self.answers.configure(given)
        if grouped is not None:
            self.regroup(grouped)

    def regroup(self, grouped: bool) -> None:
        """A group of more than one keeps its replicas' own parts (those learned so far
        kept); a group of one drops them."""
        if not grouped:
            self.replicas = None
        elif self.replicas is None:
            self.replicas = ReplicaClocks(MIN_PREFILL_SAMPLES, MIN_RATE_SAMPLES)

    def observe(self, answer: Answered, replica: str | None = None) -> None:
        """A request let its slot go (on `replica` of the group): every part learns what
        it can from it."""
        self.holds.observe(answer.held_s)  # pool-wide, as the pools fed it
        if answer.tokens is None:
            return
        rate = self.answers.observe(answer.tokens, answer.max_tokens, answer.cut,
                                    answer.ttft_s, answer.held_s)
        if answer.whole:
            self._slot.observe(answer.tokens, answer.held_s)
        if answer.ttft_s is not None and answer.prefilled is not None:
            self._prefill.observe(answer.prefilled, answer.ttft_s)
        if self.replicas is not None and replica is not None:
            self.replicas.observe(replica, rate, answer.ttft_s, answer.prefilled)

    def slot_s(self, tokens: int) -> float:
        """Expected slot hold of an answer of `tokens` tokens."""
        return self._slot.predict(tokens)

    @property
    def prefill_s_per_token(self) -> float:
        if len(self._prefill) >= MIN_PREFILL_SAMPLES:
            slope = self._prefill.slope()
            if slope:
                return slope
        hinted = self.answers.hints.prefill_s_per_token
        return PREFILL_PRIOR_S_PER_TOKEN if hinted is None else hinted

    def prefill_on(self, replica: str | None) -> float:
        """Seconds to prefill one prompt token on `replica`: its own rate once learned,
        else (or for None: a replica not known) the group's."""
        if self.replicas is not None and replica is not None:
            own = self.replicas.prefill_s_per_token(replica)
            if own is not None:
                return own
        return self.prefill_s_per_token

    def rates_on(self, replica: str | None) -> Rates | None:
        """`replica`'s stream rates: its own once learned, else the group's (None while
        the group has none: no hint, no stream measured)."""
        if self.replicas is not None and replica is not None:
            own = self.replicas.rates(replica)
            if own is not None:
                return own
        ttft, rate = self.answers.ttft_s, self.answers.tokens_per_s
        return None if ttft is None or rate is None else Rates(ttft, rate)
