"""The TTFT the gateway predicts for a request it admits. Pure: no I/O, no clock (times
are given).

A prediction is the time the request has already spent (reading, classifying), plus its
forecast wait for a slot, plus the backend's expected time from a slot to the first byte.
That last part is read from the backend's answer model (`policies.clock.answers`, the one the
queue forecast reads: `AnswerModel.first_byte_s`): for a stream its first token, for a
whole answer the first token and the decode of its expected length (capped by its
`max_tokens`). Cold, the model holds the `rates` hint or the simulated engine's own
parameters; when it still cannot tell (a real engine with no `rates`, no stream measured
yet), a prior stands in: the pool's mean slot hold for a whole answer, which holds its
slot until it is all there (`initial_hold_s` until holds are measured), and
`STREAM_PRIOR_S`, within that hold, for a stream's first chunk.
"""

from __future__ import annotations

from collections.abc import Callable

from policies.clock.answers import AnswerModel

STREAM_PRIOR_S = 1.0  # a real engine's first chunk, assumed until one is measured


def first_byte_s(answers: AnswerModel, stream: bool, max_tokens: int | None,
                 mean_hold_s: Callable[[], float]) -> float:
    """Expected seconds from a slot to the first byte of a new answer (`max_tokens`: its
    request's cap): the answer model's expectation, else the prior (`mean_hold_s`, the
    pool's mean slot hold, is read only then)."""
    expected = answers.first_byte_s(stream, max_tokens)
    if expected is not None:
        return expected
    hold = max(0.0, mean_hold_s())
    return min(STREAM_PRIOR_S, hold) if stream else hold


def predict_ttft_s(elapsed_s: float, wait_s: float, first_byte_s: float) -> float:
    """A request's predicted time to first token, from its arrival."""
    return max(0.0, elapsed_s) + max(0.0, wait_s) + max(0.0, first_byte_s)
