"""Reading a running gateway's /metrics as the samples Prometheus would store."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from router.app import RunningGateway

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(gw: RunningGateway) -> Samples:
    async with aiohttp.ClientSession() as http, http.get(gw.url + "/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)
