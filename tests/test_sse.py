"""EventRelay: whole events pass untouched, the usage chunk is kept or stripped, bounded."""

from __future__ import annotations

import pytest

from router.common.sse import MAX_EVENT_BYTES, EventRelay, EventTooLarge, comment
from router.common.usage import Usage

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}\n\n'
USAGE = (b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,'
         b'"total_tokens":9}}\n\n')
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize("strip", [True, False])
def test_usage_is_read_and_stripped_only_when_asked(strip: bool) -> None:
    relay = EventRelay(strip, Usage())
    out = relay.feed(CHUNK) + relay.feed(USAGE + DONE)
    assert out == (CHUNK + DONE if strip else CHUNK + USAGE + DONE)
    assert (relay.usage.prompt_tokens, relay.usage.completion_tokens) == (7, 2)
    assert relay.usage.known


def test_events_split_across_reads_are_held_until_whole() -> None:
    relay = EventRelay(True, Usage())
    stream = CHUNK + USAGE + DONE
    out = b"".join(relay.feed(stream[i:i + 7]) for i in range(0, len(stream), 7))
    assert out + relay.flush() == CHUNK + DONE
    assert relay.usage.completion_tokens == 2


def test_crlf_framing_is_understood() -> None:
    relay = EventRelay(True, Usage())
    out = relay.feed(CHUNK.replace(b"\n", b"\r\n") + USAGE.replace(b"\n", b"\r\n"))
    assert out == CHUNK
    assert relay.usage.prompt_tokens == 7


def test_an_event_that_never_ends_is_refused() -> None:
    relay = EventRelay(False, Usage())
    relay.feed(b"data: " + b"x" * (MAX_EVENT_BYTES // 2))
    with pytest.raises(EventTooLarge):
        relay.feed(b"x" * (MAX_EVENT_BYTES // 2 + 10))


def test_comment() -> None:
    assert comment("queued position=3") == b": queued position=3\n\n"
