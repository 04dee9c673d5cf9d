"""Property tests (hypothesis) of the two byte-level filters every request goes through:
the headers forwarded upstream, and the SSE relay that cuts streams into events."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from policies.config import BackendConfig
from router.proxy import _NOT_FORWARDED, Upstream, forward_headers
from router.sse import EventRelay, Usage

NAMES = st.sampled_from([
    "Authorization", "authorization", "X-Api-Key", "Cookie", "Connection", "Keep-Alive",
    "Transfer-Encoding", "Host", "Content-Length", "Upgrade", "Proxy-Authorization",
    "X-Trace", "X-Custom", "OpenAI-Organization", "User-Agent", "Accept", "X-Hop-Me", "TE",
]) | st.from_regex(r"\AX-[A-Za-z]{1,8}\Z")
VALUES = st.from_regex(r"\A[ -~]{0,40}\Z").map(str.strip)


class _NoConnections:
    """forward_headers never touches the connections."""


UPSTREAM = Upstream("big", BackendConfig.model_validate(
    {"url": "http://engine:8000/v1", "model": "m", "slots": 1}), "http://engine:8000/v1",
    _NoConnections())  # type: ignore[arg-type]


@settings(max_examples=300)
@given(st.lists(st.tuples(NAMES, VALUES), max_size=20), st.lists(NAMES, max_size=3))
def test_forwarded_headers_never_carry_credentials_or_hop_by_hop(
    pairs: list[tuple[str, str]], connection_listed: list[str]
) -> None:
    headers = CIMultiDict(pairs)
    if connection_listed:
        headers.add("Connection", ", ".join(connection_listed))
    out = CIMultiDict(forward_headers(CIMultiDictProxy(headers), UPSTREAM, "req-1"))
    names = {k.lower() for k in out}
    dropped = _NOT_FORWARDED | {n.lower() for n in connection_listed}
    kept = {"content-type", "accept-encoding", "x-request-id"}  # set by the gateway itself
    assert not (names & dropped) - kept
    assert out.getall("Content-Type") == ["application/json"]
    assert out.getall("X-Request-Id") == ["req-1"]  # the client's own never goes twice
    assert "Authorization" not in out  # this backend has no key: the client's never passes
    for key, value in out.items():
        if key.lower() not in kept:
            assert (key, value) in pairs or any(
                k.lower() == key.lower() and v == value for k, v in pairs)


CONTENT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


def chunk(text: str) -> bytes:
    body = {"choices": [{"index": 0, "delta": {"content": text}}]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\n'


@settings(max_examples=300)
@given(st.lists(CONTENT, max_size=15), st.booleans(), st.booleans(),
       st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=40))
def test_the_sse_relay_passes_every_event_whole_and_in_order(
    texts: list[str], strip: bool, crlf: bool, cuts: list[int]
) -> None:
    events = [chunk(t) for t in texts] + [USAGE, b"data: [DONE]\n\n"]
    stream = b"".join(events)
    wire = stream.replace(b"\n", b"\r\n") if crlf else stream
    relay = EventRelay(strip, Usage())
    out, at = [], 0
    for size in cuts * (len(wire) // max(1, min(cuts)) + 1):  # arbitrary network chunking
        if at >= len(wire):
            break
        piece = relay.feed(wire[at:at + size])
        if piece:
            assert piece.endswith(b"\n\n")  # only whole events go out
        out.append(piece)
        at += size
    out.append(relay.flush())
    expected = b"".join(e for e in events if not (strip and e == USAGE))
    assert b"".join(out) == expected
    assert relay.usage.known and relay.usage.completion_tokens == 3
    assert relay.usage.seen_events == len(texts) + 1  # the data events; [DONE] is not one

