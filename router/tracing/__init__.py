"""OpenTelemetry traces of requests, behind a seam that costs nothing when off.

`gw.tracer` is None unless `tracing.enabled`: each hook on the request path is then one
`is not None` branch, and OpenTelemetry is never imported (it is an optional extra,
`slotgate[otel]`). When on, `router.tracing.otel` holds the provider, the exporter and
one `RequestTrace` per request (its server span and the child spans' hooks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from policies.config import TracingConfig

if TYPE_CHECKING:
    from router.tracing.otel import Tracer


def start_tracer(config: TracingConfig) -> Tracer | None:
    """The tracer `config` asks for (its exporter started), or None when tracing is off."""
    if not config.enabled:
        return None
    try:
        from router.tracing.otel import Tracer
    except ImportError as exc:  # the extra is not installed: say how to get it
        raise RuntimeError("tracing.enabled needs OpenTelemetry: pip install 'slotgate[otel]'"
                           f" ({exc})") from None
    return Tracer(config)
