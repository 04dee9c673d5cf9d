"""Time-to-first-token objectives: which one applies to a request, and whether a finished
request met it. Pure: no I/O, no clock.

A request is judged once: when its first token reaches the gateway, or when it ends
without one (rejected, timed out, failed: missed). A client that leaves before its first
token is missed only if its objective had already passed; one that leaves sooner says
nothing about the gateway and is not judged.
"""

from __future__ import annotations

import enum

from policies.config import Config, Priority, RouteConfig


class Verdict(enum.StrEnum):
    ATTAINED = "attained"
    MISSED = "missed"


def objective_s(config: Config, route: RouteConfig | None, priority: Priority) -> float:
    """The TTFT objective of `priority` on `route`: the route's own, else the config's."""
    own = route.slo.of(priority) if route is not None else None
    return (own or config.slo.of(priority)).ttft_s


def verdict(objective_ms: float | None, ttft_ms: float | None, elapsed_ms: float,
            client_left: bool) -> Verdict | None:
    """Attained or missed; None when not judged (no objective applied, or the client left
    before its objective was due and before a first token)."""
    if objective_ms is None:
        return None
    if ttft_ms is not None:
        return Verdict.ATTAINED if ttft_ms <= objective_ms else Verdict.MISSED
    if client_left and elapsed_ms <= objective_ms:
        return None
    return Verdict.MISSED
