"""The `slo` section and a route's `slo`: each priority class's time-to-first-token
objective, gateway-wide with a route's own where it gives one.

Pure data and validation: no YAML, no files, no environment lookups.
"""

from __future__ import annotations

from pydantic import Field

from policies.config.base import Priority, StrictModel


class ClassObjective(StrictModel):
    """What one class of callers is promised: its first token within `ttft_s` of arrival."""

    ttft_s: float = Field(gt=0, le=3600)


class SloConfig(StrictModel):
    """The top-level `slo`: every class has an objective (these defaults unless given).

    Critical callers are interactive (a person waits on the first word), standard ones
    tolerate a short queue, sheddable ones are batch work that may wait behind both.
    """

    critical: ClassObjective = ClassObjective(ttft_s=2.0)
    standard: ClassObjective = ClassObjective(ttft_s=5.0)
    sheddable: ClassObjective = ClassObjective(ttft_s=20.0)

    def of(self, priority: Priority) -> ClassObjective:
        objective: ClassObjective = getattr(self, priority)  # (a str: no `.value` call)
        return objective


class RouteSloConfig(StrictModel):
    """A route's `slo`: the classes it names override the top-level objective."""

    critical: ClassObjective | None = None
    standard: ClassObjective | None = None
    sheddable: ClassObjective | None = None

    def of(self, priority: Priority) -> ClassObjective | None:
        objective: ClassObjective | None = getattr(self, priority)
        return objective
