"""How an upstream exchange failed (`FailureKind`), and what follows from it: whose fault it
is (`blame`), whether the request may go to another backend (`retryable`), and the strings
the ledger and the metrics have always used for it (`code`, `metric_kind`).

The kinds are made by the upstream leg (router.upstream.proxy) and travel as they are to
the breaker, the retry rule, the metrics and the ledger; only the response edge turns them
into an OpenAI-shaped error. Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum

from policies.health.breaker import Blame, blame_status


class FailureKind(enum.StrEnum):
    """What went wrong between the gateway and a backend."""

    REFUSED = "refused"  # no connection, or it closed before any answer came
    CONNECT_TIMEOUT = "connect_timeout"  # no connection within the connect timeout
    FIRST_BYTE_TIMEOUT = "first_byte_timeout"  # no answer within the first-byte timeout
    IDLE_TIMEOUT = "idle_timeout"  # the answer stopped for longer than the idle timeout
    DROPPED = "dropped"  # the connection was lost (or its framing broke) mid-answer
    BAD_RESPONSE = "bad_response"  # the answer's head was not valid HTTP/1.1
    # A 200 whose body is not what the API promises: not JSON, no choices/data/output, a
    # stream without one valid event. The engine's fault, like a dropped connection.
    BAD_ANSWER = "bad_answer"
    TOO_LARGE = "too_large"  # an answer or one of its events exceeds the gateway's limit
    UPSTREAM_5XX = "upstream_5xx"  # the engine answered a server error (>= 500)
    UPSTREAM_429 = "upstream_429"  # the engine's own backpressure
    UPSTREAM_4XX = "upstream_4xx"  # the engine refused the request (any other non-200)
    UPSTREAM_AUTH = "upstream_auth"  # the engine refused the gateway's credentials


# The connection failed: the engine's fault, whatever the request was.
CONNECTION_FAILURES = frozenset({
    FailureKind.REFUSED, FailureKind.CONNECT_TIMEOUT, FailureKind.FIRST_BYTE_TIMEOUT,
    FailureKind.IDLE_TIMEOUT, FailureKind.DROPPED, FailureKind.BAD_RESPONSE,
    FailureKind.BAD_ANSWER,
})
# The engine answered with an error status of its own (relayed to the client as it is).
ENGINE_ANSWERS = frozenset({
    FailureKind.UPSTREAM_5XX, FailureKind.UPSTREAM_429, FailureKind.UPSTREAM_4XX,
})

# The error code of each kind, as the ledger, the logs and the clients have always seen it
# (an engine's own error answer keeps the code it gave, this one only when it gave none).
_CODES = {
    FailureKind.REFUSED: "upstream_unreachable",
    FailureKind.CONNECT_TIMEOUT: "upstream_unreachable",
    FailureKind.BAD_RESPONSE: "upstream_unreachable",
    FailureKind.FIRST_BYTE_TIMEOUT: "upstream_timeout",
    FailureKind.IDLE_TIMEOUT: "upstream_timeout",
    FailureKind.DROPPED: "upstream_dropped",
    FailureKind.BAD_ANSWER: "upstream_bad_answer",
    FailureKind.TOO_LARGE: "upstream_too_large",
    FailureKind.UPSTREAM_5XX: "upstream_error",
    FailureKind.UPSTREAM_429: "upstream_error",
    FailureKind.UPSTREAM_4XX: "upstream_error",
    FailureKind.UPSTREAM_AUTH: "upstream_auth_failed",
}
# The `kind` label of slotgate_upstream_errors (the gateway's credentials refused: none).
_METRIC_KINDS = {
    FailureKind.REFUSED: "connect",
    FailureKind.CONNECT_TIMEOUT: "connect",
    FailureKind.BAD_RESPONSE: "connect",
    FailureKind.FIRST_BYTE_TIMEOUT: "timeout",
    FailureKind.IDLE_TIMEOUT: "timeout",
    FailureKind.DROPPED: "dropped",
    FailureKind.BAD_ANSWER: "invalid",
    FailureKind.TOO_LARGE: "dropped",
    FailureKind.UPSTREAM_5XX: "status",
    FailureKind.UPSTREAM_429: "status",
    FailureKind.UPSTREAM_4XX: "status",
}
METRIC_KINDS = tuple(dict.fromkeys(_METRIC_KINDS.values()))  # its values, in order


def code(kind: FailureKind) -> str:
    """The error code of `kind` (an engine's answer: when it gave no code of its own)."""
    return _CODES[kind]


def metric_kind(kind: FailureKind) -> str | None:
    """The `kind` label `kind` is counted under, or None when it is not counted."""
    return _METRIC_KINDS.get(kind)


def answered(status: int) -> FailureKind:
    """The kind of an engine's own non-200 answer with HTTP `status`."""
    if status in (401, 403, 407):
        return FailureKind.UPSTREAM_AUTH
    if status == 429:
        return FailureKind.UPSTREAM_429
    return FailureKind.UPSTREAM_5XX if status >= 500 else FailureKind.UPSTREAM_4XX


def blame(kind: FailureKind, engine_status: int = 0) -> Blame:
    """Whose fault a failure is: a failed connection is the engine's; an engine's error
    answer is judged by its status (`blame_status`); the rest is the request's (an answer
    too large, the gateway's credentials refused)."""
    if kind in ENGINE_ANSWERS:
        return blame_status(engine_status)
    return Blame.ENGINE if kind in CONNECTION_FAILURES else Blame.REQUEST


def retryable(kind: FailureKind, engine_status: int = 0, healthy: bool | None = None) -> bool:
    """May the request go to another backend (it would not fail there the same way)? An
    engine's 429 always may; an unsure failure may unless the backend passed the health
    check made after it (`healthy`: then the request caused it)."""
    if kind is FailureKind.UPSTREAM_429:
        return True
    verdict = blame(kind, engine_status)
    if verdict is Blame.UNSURE:
        return not healthy
    return verdict is Blame.ENGINE
