"""How long one backend's answers take: time to the first token, tokens per second per
stream, and how many tokens answers run to. Learned from finished answers; until then
from the config's hints (`rates`, or a simulated engine's own parameters). Pure, no I/O.

`AnswerModel.remaining_s` says what is left of a running answer given what it has
produced; `fresh_s` how long a new one holds its slot; `first_byte_s` how soon after its
slot a new one's first byte comes (the TTFT prediction, `policies.clock.ttft`);
`expected_tokens` how long it runs (the cost of an option). Each is None when the model
cannot tell (no rates known yet, or no length to run to): the caller then falls back
on holding times (`policies.clock.holds`) or a prior of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from policies.clock.lengths import LengthWindow, Survival, uniform
from policies.config import BackendConfig, SimulatedSpec

ALPHA = 0.2  # weight of a new measurement of the rates (the first replaces the hint)
MIN_LENGTHS = 8  # answers measured before their lengths replace the hinted ones
HINT_SPREAD = 0.5  # a hinted `output_tokens` stands for lengths within +/- half of it
NO_DELAY_RATE = 1e6  # tokens/s of a simulated engine without decode delay
# A fresh answer's expected length (each request's TTFT prediction asks) is kept per
# max_tokens until this share of the lengths' window is new: not rebuilt per answer.
STALE_SHARE = 1 / 32
MEMO_SIZE = 64  # max_tokens values remembered at once


@dataclass(frozen=True, slots=True)
class Hints:
    """What the config says of an engine before anything is measured."""

    ttft_s: float | None = None
    tokens_per_s: float | None = None
    lengths: Survival | None = None  # None: an answer runs to its max_tokens
    prefill_s_per_token: float | None = None  # None: the clock's prior


class Rates(NamedTuple):
    """An engine's stream rates: seconds from its slot to the first token, and tokens per
    second per stream after it (one replica's own, `policies.clock.replica`)."""

    ttft_s: float
    tokens_per_s: float


def hints(config: BackendConfig) -> Hints:
    """The backend's `rates` hint, each figure it leaves out taken from its (first)
    simulated engine's parameters when it has one."""
    spec = _simulated(config)
    rates = config.rates
    ttft = rates.ttft_s if rates is not None and rates.ttft_s is not None else None
    tps = rates.tokens_per_s if rates is not None and rates.tokens_per_s is not None else None
    lengths = (uniform(rates.output_tokens, HINT_SPREAD)
               if rates is not None and rates.output_tokens is not None else None)
    prefill = (1 / rates.prefill_tokens_per_s
               if rates is not None and rates.prefill_tokens_per_s is not None else None)
    if spec is not None:
        ttft = spec.ttft_s if ttft is None else ttft
        if tps is None:
            tps = spec.tokens_per_s or NO_DELAY_RATE
        if lengths is None:
            lengths = uniform(spec.output_tokens, spec.output_tokens_spread)
        if prefill is None and spec.prefill_s_per_token:
            prefill = spec.prefill_s_per_token
    return Hints(ttft, tps, lengths, prefill)


def _simulated(config: BackendConfig) -> SimulatedSpec | None:
    if config.simulated is not None:
        return config.simulated
    for endpoint in config.endpoints or ():
        if endpoint.simulated is not None:
            return endpoint.simulated
    return None


class AnswerModel:
    """One backend's answers, learned online (shared by its pools)."""

    __slots__ = ("_expected", "_expected_at", "_hints", "lengths", "rate_samples",
                 "tokens_per_s", "ttft_s")

    def __init__(self, given: Hints | None = None) -> None:
        self._hints = given or Hints()
        self.ttft_s = self._hints.ttft_s
        self.tokens_per_s = self._hints.tokens_per_s
        self.rate_samples = 0
        self.lengths = LengthWindow()
        self._expected: dict[int | None, float | None] = {}  # max_tokens -> expected length
        self._expected_at = -1  # `lengths.added` when `_expected` was begun

    def configure(self, given: Hints) -> None:
        """New hints (a reload): they stand until measurements replace them."""
        self._hints = given
        self._expected_at = -1
        if not self.rate_samples:
            self.ttft_s, self.tokens_per_s = given.ttft_s, given.tokens_per_s

    @property
    def hints(self) -> Hints:
        return self._hints

    @property
    def known(self) -> bool:
        return self.ttft_s is not None and self.tokens_per_s is not None

    def survival(self) -> Survival:
        """The lengths answers run to: measured (the first few already, without a hint),
        or hinted, or none (run to the cap)."""
        if len(self.lengths) >= MIN_LENGTHS or (self._hints.lengths is None and self.lengths):
            return self.lengths.survival()
        return self._hints.lengths or Survival((), ())

    def observe(self, tokens: int, max_tokens: int | None, cut: bool = False,
                ttft_s: float | None = None, held_s: float | None = None) -> float | None:
        """A finished answer of `tokens` tokens (`cut`: stopped by its client); with a
        stream's first-token time and slot hold, its rates too. Returns the decode rate
        it measured (None: none), which a replica's own rates learn from as well."""
        if tokens < 0:
            return None
        capped = cut or (max_tokens is not None and tokens >= max_tokens)
        self.lengths.add(tokens, capped)
        if ttft_s is None or held_s is None or not 0 <= ttft_s < held_s or tokens < 2:
            return None
        rate = (tokens - 1) / (held_s - ttft_s)
        if self.rate_samples == 0 or self.ttft_s is None or self.tokens_per_s is None:
            self.ttft_s, self.tokens_per_s = ttft_s, rate
        else:
            self.ttft_s += ALPHA * (ttft_s - self.ttft_s)
            self.tokens_per_s += ALPHA * (rate - self.tokens_per_s)
        self.rate_samples += 1
        return rate

    def expected_tokens(self, max_tokens: int | None) -> float | None:
        """The expected length of an answer not yet begun, capped by `max_tokens`; None
        when no length is measured or hinted (the cap alone is not a length). Remembered
        until `STALE_SHARE` of the window is new (every answer while it is short)."""
        added = self.lengths.added
        if (added - self._expected_at >= max(1.0, STALE_SHARE * len(self.lengths))
                or len(self._expected) >= MEMO_SIZE):
            self._expected.clear()
            self._expected_at = added
        if max_tokens in self._expected:
            return self._expected[max_tokens]
        lengths = self.survival()
        expected = lengths.remaining(0.0, max_tokens) if lengths.points else None
        self._expected[max_tokens] = expected
        return expected

    def first_byte_s(self, stream: bool, max_tokens: int | None) -> float | None:
        """Expected seconds from a slot to a new answer's first byte: for a stream its
        first token; for a whole answer, which comes all at once, the first token and the
        decode of its expected length, run to `max_tokens` when no length is known (as
        `fresh_s`, from the remembered length: cheap enough for every request)."""
        ttft, rate = self.ttft_s, self.tokens_per_s
        if stream or ttft is None:
            return ttft
        if rate is None or rate <= 0:
            return None
        tokens = self.expected_tokens(max_tokens)
        if tokens is None:
            if max_tokens is None:
                return None
            tokens = max(0.0, float(max_tokens))
        return ttft + max(0.0, tokens - 1.0) / rate

    def fresh_s(self, max_tokens: int | None, rates: Rates | None = None) -> float | None:
        """Expected slot hold of an answer not yet begun."""
        return self.remaining_s(0.0, 0, max_tokens, rates)

    def remaining_s(self, elapsed_s: float, tokens: int | None,
                    max_tokens: int | None, rates: Rates | None = None) -> float | None:
        """Expected seconds left of an answer running for `elapsed_s` that has streamed
        `tokens` (None: not counted, e.g. not streamed: what it would have produced by
        now is inferred from the rates). Conditioned on the tokens produced, capped by
        `max_tokens`. `rates`: one replica's own, in place of the backend's (its answers'
        lengths are the backend's all the same)."""
        ttft, rate = (self.ttft_s, self.tokens_per_s) if rates is None else rates
        if ttft is None or rate is None or rate <= 0:
            return None
        if tokens is None:
            produced = 0.0 if elapsed_s < ttft else 1.0 + (elapsed_s - ttft) * rate
        else:
            produced = float(tokens)
        left = self.survival().remaining(produced, max_tokens)
        if left is None:
            return None
        if produced <= 0:  # still before its first token
            return max(0.0, ttft - elapsed_s) + max(0.0, left - 1.0) / rate
        return left / rate
