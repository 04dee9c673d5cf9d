"""What the gateway expects of a backend's first byte, learnt from its recent answers, and
the TTFT it predicts for a request it admits. Pure: no I/O, no clock (times are given).

A prediction is the time the request has already spent (reading, classifying), plus its
forecast wait for a slot, plus the backend's expected time from a slot to the first byte.
That last part is a moving average of recent ones, kept apart for streamed answers (the
first chunk) and whole ones (the first byte comes with the whole answer), and seeded by
a prior: a simulated engine's own TTFT and decode speed, else `initial_hold_s`.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.config import BackendConfig

ALPHA = 0.2  # weight of the newest answer: about the last ten count
STREAM_PRIOR_S = 1.0  # a real engine's first chunk, assumed until one is measured


@dataclass(slots=True)
class FirstByteModel:
    """Expected seconds from a slot being granted to the backend's first byte."""

    stream_s: float
    whole_s: float

    @classmethod
    def prior(cls, config: BackendConfig) -> FirstByteModel:
        engines = config.endpoints or ()
        specs = [e.simulated for e in engines if e.simulated is not None]
        if config.simulated is not None:
            specs.append(config.simulated)
        if not specs:
            return cls(min(STREAM_PRIOR_S, config.initial_hold_s), config.initial_hold_s)
        ttft = sum(s.ttft_s for s in specs) / len(specs)
        decode = sum(s.output_tokens / s.tokens_per_s for s in specs if s.tokens_per_s)
        return cls(ttft, ttft + decode / len(specs))

    def expect(self, stream: bool) -> float:
        return self.stream_s if stream else self.whole_s

    def observe(self, stream: bool, seconds: float) -> None:
        if seconds < 0:  # clocks read in another order than expected: nothing learnt
            return
        if stream:
            self.stream_s += ALPHA * (seconds - self.stream_s)
        else:
            self.whole_s += ALPHA * (seconds - self.whole_s)


def predict_ttft_s(elapsed_s: float, wait_s: float, first_byte_s: float) -> float:
    """A request's predicted time to first token, from its arrival."""
    return max(0.0, elapsed_s) + max(0.0, wait_s) + max(0.0, first_byte_s)
