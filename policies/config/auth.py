"""The `auth` section: client keys, their tenants, priorities, limits and budgets, and
what an operator makes public.

Pure data and validation: no YAML, no files, no environment lookups.
"""

from __future__ import annotations

import enum
from typing import Literal, Self

from pydantic import Field, model_validator

from policies.config.base import Priority, StrictModel


class BudgetConfig(StrictModel):
    """What one key may spend per calendar period (UTC): tokens, cost, or both."""

    period: Literal["hour", "day", "month"]
    tokens: int | None = Field(default=None, ge=1)  # prompt + completion
    cost: float | None = Field(default=None, gt=0)  # in the config's currency

    @model_validator(mode="after")
    def _some_limit(self) -> Self:
        if self.tokens is None and self.cost is None:
            raise ValueError("a budget needs 'tokens', 'cost' or both")
        return self


class KeyScope(enum.StrEnum):
    """What a key may read beyond its own tenant's."""

    METRICS = "metrics"  # every tenant's series in /metrics and rows in /dashboard/events


class ApiKeyConfig(StrictModel):
    """One client key: stored as its SHA-256 (hex), or read from an environment variable."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # in the ledger and logs
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    tenant: str = Field(min_length=1, max_length=64)
    admin: bool = False  # may call /admin/* (and sees every tenant, as `metrics` does)
    scopes: frozenset[KeyScope] = frozenset()  # `metrics`: a scrape key
    priority: Priority = Priority.STANDARD
    # Its tenant's share of a `fair` queue: served tokens count 1/weight against it.
    weight: float = Field(default=1.0, gt=0, le=1000)
    # Held across every gateway process with `coordination.mode: redis`.
    max_concurrent: int | None = Field(default=None, ge=1, le=100_000)
    rpm: int | None = Field(default=None, ge=1, le=10_000_000)  # requests per minute
    tpm: int | None = Field(default=None, ge=1, le=10_000_000_000)  # tokens per minute
    budgets: tuple[BudgetConfig, ...] = ()

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.sha256 is None) == (self.key_env is None):
            raise ValueError("give exactly one of 'sha256' or 'key_env'")
        return self


class Public(enum.StrEnum):
    """What an operator may open to callers without a key while auth is on."""

    METRICS = "metrics"  # GET /metrics, for a Prometheus scraper
    MODELS = "models"  # GET /v1/models: the public model (route) names
    OPENAPI = "openapi"  # GET /openapi.json
    PAGES = "pages"  # the dashboard's live feed, GET /dashboard/events (live load)
    # Every tenant's series and rows to anyone who may read /metrics or the feed (before,
    # what every scrape saw); without it, only an admin or `metrics` key sees them.
    TENANTS = "tenants"


class AuthConfig(StrictModel):
    enabled: bool = False  # off: every client is accepted (said at startup)
    keys: tuple[ApiKeyConfig, ...] = ()
    public: frozenset[Public] = frozenset()  # answered without a key even with auth on

    @model_validator(mode="after")
    def _keys_when_on(self) -> Self:
        if self.enabled and not self.keys:
            raise ValueError("auth is enabled but no key is configured")
        ids = [key.id for key in self.keys]
        if len(ids) != len(set(ids)):
            raise ValueError("key ids must be unique")
        return self
