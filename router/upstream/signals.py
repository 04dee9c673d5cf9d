"""Engine signals as a soft hint: each replica's Prometheus page, read in the background.

A backend with `signals.scrape` has one task that reads every replica's metrics each
`every_s` and keeps its KV-cache pressure (vLLM's `vllm:kv_cache_usage_perc`, or the older
`vllm:gpu_cache_usage_perc`; llama.cpp server's `llamacpp:kv_cache_usage_ratio`), 0 to 1.
The pick weighs a replica's load by it. A reading older than `stale_after_s`, a page that
fails or names none of these counts as no hint at all: a scrape never stalls dispatch and
never overrides the gateway's own counts of who has a free slot.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from router.common.errors import ApiError
from router.upstream.errors import UpstreamError
from router.upstream.proxy import Upstream
from router.upstream.wire import Target

log = logging.getLogger("slotgate")

KV_PRESSURE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc",
               "llamacpp:kv_cache_usage_ratio")
PAGE_LIMIT = 4 * 1024 * 1024  # an engine's metrics page, read at most this far


def kv_pressure(page: str) -> float | None:
    """The highest KV-cache usage the page reports (0-1), None when it has none."""
    found: list[float] = []
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name in KV_PRESSURE and math.isfinite(sample.value):
                found.append(min(1.0, max(0.0, sample.value)))
    return max(found) if found else None


class Reading:
    """A replica's last hint and when it was read (monotonic seconds)."""

    __slots__ = ("at", "pressure")

    def __init__(self) -> None:
        self.pressure, self.at = 0.0, -math.inf

    def penalty(self, stale_after_s: float, now: float) -> float:
        return self.pressure if now - self.at <= stale_after_s else 0.0


async def read_pressure(upstream: Upstream, path: str) -> float | None:
    """One read of the replica's metrics page at its origin; None on any failure."""
    base = urlsplit(upstream.base_url)
    target = Target.parse(f"{base.scheme}://{base.netloc}{path}")
    limit = upstream.config.connect_timeout_s
    try:
        async with asyncio.timeout(limit):
            response = await upstream.http.request("GET", target, (), b"",
                                                   connect_timeout_s=limit)
            try:
                page = await response.read(PAGE_LIMIT)
            finally:
                response.release()
        if response.status != 200:
            return None
        return kv_pressure(page.decode(errors="replace"))
    except (UpstreamError, ApiError, TimeoutError, ValueError):  # a hint: a failure is none
        return None


async def scrape_forever(upstreams: Callable[[], Mapping[str, Upstream]],
                         readings: dict[str, Reading], path: str, every_s: float) -> None:
    """Read every replica's page (`upstreams()`: the current ones) each `every_s`, until
    cancelled."""
    while True:
        for replica, upstream in list(upstreams().items()):
            pressure = await read_pressure(upstream, path)
            if pressure is not None:
                reading = readings.setdefault(replica, Reading())
                reading.pressure, reading.at = pressure, time.monotonic()
        await asyncio.sleep(every_s)  # the scrape period itself


async def stop(task: asyncio.Task[None] | None) -> None:
    """End a scraper (its cancellation is its own; one of the caller's propagates)."""
    if task is not None and not task.done():
        task.cancel()
        await asyncio.wait({task})
