"""Property tests (hypothesis) of the two byte-level filters every request goes through:
the headers forwarded upstream, and the SSE relay that cuts streams into events."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from policies.headers import DEFAULT_FORWARDED, never_forwarded
from router.common.sse import EventRelay
from router.common.usage import Usage
from router.upstream.forwarding import forward_headers

NAMES = st.sampled_from([
    "Authorization", "authorization", "X-Api-Key", "Cookie", "Connection", "Keep-Alive",
    "Transfer-Encoding", "Host", "Content-Length", "Upgrade", "Proxy-Authorization",
    "X-Trace", "X-Custom", "OpenAI-Organization", "User-Agent", "Accept", "X-Hop-Me", "TE",
    "Traceparent", "Content-Encoding", "X-Forwarded-For", "Forwarded", "X-Slotgate-Arm",
    "X-Goog-Api-Key", "Anthropic-Api-Key", "X-Auth-Token", "Idempotency-Key",
]) | st.from_regex(r"\AX-[A-Za-z]{1,8}\Z")
VALUES = st.from_regex(r"\A[ -~]{0,40}\Z").map(str.strip)
# Set by the gateway itself, whatever the client sent.
GATEWAY_SET = {"content-type", "accept-encoding", "x-request-id", "forwarded",
               "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"}


@settings(max_examples=300)
@given(st.lists(st.tuples(NAMES, VALUES), max_size=20), st.lists(NAMES, max_size=3))
def test_forwarded_headers_come_from_the_allow_list_only(
    pairs: list[tuple[str, str]], connection_listed: list[str]
) -> None:
    headers = CIMultiDict(pairs)
    if connection_listed:
        headers.add("Connection", ", ".join(connection_listed))
    out = CIMultiDict(forward_headers(CIMultiDictProxy(headers), "req-1", None, "10.1.2.3"))
    names = {k.lower() for k in out}
    listed = {n.lower() for n in connection_listed}
    assert names - GATEWAY_SET <= DEFAULT_FORWARDED - listed
    assert not any(never_forwarded(n) for n in names - GATEWAY_SET)
    assert out.getall("Content-Type") == ["application/json"]
    assert out.getall("X-Request-Id") == ["req-1"]  # the client's own never goes twice
    assert out.getall("X-Forwarded-For") == ["10.1.2.3"]  # the peer's, never the client's
    assert out.getall("Forwarded")[0].startswith("for=10.1.2.3;proto=http")
    assert "Authorization" not in out  # this backend has no key: the client's never passes
    for key, value in out.items():
        if key.lower() not in GATEWAY_SET:
            assert (key, value) in pairs or any(
                k.lower() == key.lower() and v == value for k, v in pairs)


CONTENT = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12)


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

