"""Two tenants' keys for the tests of what operators see per tenant (metrics, dashboard)."""

from __future__ import annotations

import hashlib
from typing import Any

# The key of each tenant: acme (weight 2) and beta (weight 1).
KEYS = {"acme": "sk-acme-0123456789", "beta": "sk-beta-0123456789"}
WEIGHTS = {"acme": 2.0, "beta": 1.0}


def with_tenants(raw: dict[str, Any], enabled: bool = True) -> dict[str, Any]:
    """`raw` with one key per tenant of KEYS (auth on unless `enabled` is False); the
    metrics and the dashboard's feed, every tenant's series and rows, open without a key."""
    raw["auth"] = {"enabled": enabled, "public": ["metrics", "pages", "tenants"], "keys": [
        {"id": f"{tenant}-key", "tenant": tenant, "weight": WEIGHTS[tenant],
         "sha256": hashlib.sha256(key.encode()).hexdigest()}
        for tenant, key in KEYS.items()]}
    return raw
