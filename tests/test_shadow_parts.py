"""The shadow comparisons' own parts: the copy of a sampled answer read back as text
(a stream's deltas, a whole answer, a cut last event), and the hourly token bounds."""

from __future__ import annotations

import orjson
import pytest

from router.quality.budget import HourlyTokens
from router.upstream.capture import MAX_BYTES, Capture


def chunk(**choice: object) -> bytes:
    return b"data: " + orjson.dumps({"object": "chat.completion.chunk",
                                     "choices": [{"index": 0, **choice}]}) + b"\n\n"


@pytest.mark.parametrize(("chunks", "text"), [
    ([chunk(delta={"role": "assistant", "content": "Hel"}), chunk(delta={"content": "lo"}),
      b"data: [DONE]\n\n"], "Hello"),
    ([chunk(text="a completion "), chunk(text="in two")], "a completion in two"),
    ([chunk(delta={"content": "kept"}), b'data: {"choices": [{"delta": {"cont'], "kept"),
    ([b": a comment\n\n", chunk(delta={"tool_calls": []}), b'data: {"usage": {}}\n\n'], ""),
    ([chunk(delta={"content": "x" * 100}), b"data: not json\n\n"], "x" * 100),
])
def test_a_streams_text_is_its_deltas(chunks: list[bytes], text: str) -> None:
    capture = Capture()
    for part in chunks:
        capture.add(part)
    assert capture.text() == text


def test_a_whole_answers_text_is_its_choices() -> None:
    capture = Capture()
    capture.answer = {"choices": [{"message": {"role": "assistant", "content": "whole"}}]}
    assert capture.text() == "whole"


def test_a_capture_keeps_at_most_its_bound() -> None:
    capture = Capture()
    big = chunk(delta={"content": "y" * 1000})
    for _ in range(2 * MAX_BYTES // len(big)):
        capture.add(big)
    assert MAX_BYTES <= capture.size < MAX_BYTES + len(big)


def test_tokens_are_counted_per_hour_in_all_and_per_tenant() -> None:
    now = [7200.0]
    tokens = HourlyTokens(clock=lambda: now[0])
    tokens.spend("a", 10)
    tokens.spend(None, 5)
    tokens.spend("b", 1)
    assert (tokens.spent(None), tokens.spent("a"), tokens.spent("b")) == (16, 10, 1)
    now[0] += 3599
    assert tokens.spent(None) == 16
    now[0] += 1  # the next hour starts afresh
    assert (tokens.spent(None), tokens.spent("a")) == (0, 0)
