"""An upstream exchange that failed (`UpstreamFailure`), typed by its `FailureKind`.

The upstream leg (router.upstream.proxy) raises it; the breaker, the retry rule, the metrics and the
ledger read its kind; only the response edge (router.dispatch) turns it into the
OpenAI-shaped `ApiError` the client sees (`api_error`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.health import failures
from policies.health.failures import FailureKind
from router.common.errors import ApiError


@dataclass(eq=False)
class UpstreamFailure(Exception):
    """One failed upstream exchange: its kind, the backend, and what the client is told.

    An engine's own error answer keeps its HTTP status (`engine_status`), the status, type
    and code it is relayed with, and its Retry-After; `healthy` is the backend's health
    check made after it when the status alone cannot tell whose fault it was
    (router.upstream.health)."""

    kind: FailureKind
    backend: str
    message: str
    status: int = 502  # what the client sees
    type: str = "api_error"
    engine_code: str | None = None  # an engine's own error code, relayed when it gave one
    engine_status: int = 0  # the engine's HTTP status, when it answered
    headers: dict[str, str] = field(default_factory=dict)
    healthy: bool | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def code(self) -> str:
        """The error code clients, the ledger and the logs see."""
        return self.engine_code if self.engine_code is not None else failures.code(self.kind)

    def api_error(self) -> ApiError:
        """The client's answer: OpenAI's error shape."""
        return ApiError(self.status, self.message, self.type, self.code,
                        headers=dict(self.headers))
