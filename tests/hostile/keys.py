"""The hostile suite's keys and what it reads back: a tenant key and an admin key, the
gateway config with auth on, scraped metrics and access-log lines."""

from __future__ import annotations

import hashlib
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.app import RunningGateway

KEY = "sk-hostile-tests-0123456789"
ADMIN_KEY = "sk-hostile-admin-9876543210"
BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def with_auth(raw: dict[str, Any], **auth: Any) -> dict[str, Any]:
    """`raw` with auth on: one tenant key and one admin key."""
    raw["auth"] = {"enabled": True, "keys": [
        {"id": "team", "tenant": "research",
         "sha256": hashlib.sha256(KEY.encode()).hexdigest()},
        {"id": "ops", "tenant": "platform", "admin": True,
         "sha256": hashlib.sha256(ADMIN_KEY.encode()).hexdigest()},
    ], **auth}
    return raw


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def scrape(gw: RunningGateway, key: str | None = KEY) -> Samples:
    async with aiohttp.ClientSession() as http, http.get(
            gw.url + "/metrics", headers=bearer(key) if key else {}) as resp:
        assert resp.status == 200, await resp.text()
        text = await resp.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "slotgate.access"]
