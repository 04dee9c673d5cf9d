"""The `ledger`, `coordination` and `logging` sections: what the gateway writes and shares.

Pure data and validation: no YAML, no files, no environment lookups.
"""

from __future__ import annotations

import enum
from typing import Self

from pydantic import Field, model_validator

from policies.config.base import StrictModel


class LedgerConfig(StrictModel):
    """Where the usage and cost ledger goes: a SQLite file, or PostgreSQL for many replicas.

    Neither `path` nor `url`: no ledger.
    """

    path: str | None = Field(default=None, min_length=1, max_length=4096)
    url: str | None = Field(default=None, pattern=r"^postgres(ql)?://", max_length=4096)
    url_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")  # secret
    retention_days: float | None = Field(default=90, gt=0, le=36_500)  # None: keep all
    max_rows: int | None = Field(default=10_000_000, ge=1, le=10**12)  # None: no size bound
    batch_rows: int = Field(default=500, ge=1, le=100_000)
    flush_interval_s: float = Field(default=0.5, gt=0, le=60)
    max_pending_rows: int = Field(default=100_000, ge=1, le=10_000_000)

    @model_validator(mode="after")
    def _one_place(self) -> Self:
        if sum(x is not None for x in (self.path, self.url, self.url_env)) > 1:
            raise ValueError("give one of 'path' (SQLite), 'url' or 'url_env' (PostgreSQL)")
        return self

    @property
    def enabled(self) -> bool:
        return self.path is not None or self.url is not None or self.url_env is not None

    @property
    def target(self) -> str | None:
        """The SQLite path or PostgreSQL URL, when given in the file (see `url_env`)."""
        return self.url or self.path


class CoordinationMode(enum.StrEnum):
    LOCAL = "local"  # pools live in this process
    REDIS = "redis"  # pools are shared by every process and replica through Redis


class RedisDown(enum.StrEnum):
    """What a replica does while Redis is unreachable."""

    FAIL_CLOSED = "fail_closed"  # 503 + Retry-After: never more than `slots` in flight
    FAIL_OPEN_LOCAL = "fail_open_local"  # a local pool of slots / expected_replicas each


class CoordinationConfig(StrictModel):
    mode: CoordinationMode = CoordinationMode.LOCAL
    url: str | None = Field(default=None, pattern=r"^(rediss?|unix)://", max_length=4096)
    url_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")  # secret
    key_prefix: str = Field(default="slotgate", pattern=r"^[A-Za-z0-9._:-]{1,64}$")
    lease_ttl_s: float = Field(default=15.0, ge=1.0, le=600)  # renewed every ttl/3
    call_timeout_s: float = Field(default=0.5, gt=0, le=10)  # every Redis call
    max_connections: int = Field(default=256, ge=8, le=10_000)  # this process's to Redis
    connection_wait_s: float = Field(default=5.0, gt=0, le=60)  # for a free one, at most
    recheck_s: float = Field(default=1.0, ge=0.05, le=60)  # safety net for lost wake-ups
    on_redis_down: RedisDown = RedisDown.FAIL_CLOSED
    expected_replicas: int = Field(default=1, ge=1, le=10_000)  # processes x replicas
    breaker_failures: int = Field(default=3, ge=1, le=1000)  # consecutive, to open
    breaker_open_s: float = Field(default=5.0, gt=0, le=600)  # before a half-open probe

    @model_validator(mode="after")
    def _url_for_redis(self) -> Self:
        if self.url is not None and self.url_env is not None:
            raise ValueError("give 'url' or 'url_env', not both")
        if self.mode is CoordinationMode.REDIS and self.url is None and self.url_env is None:
            raise ValueError("mode 'redis' needs 'url' (redis://host:6379/0), or 'url_env' "
                             "naming the environment variable that holds it")
        if self.recheck_s * 3 > self.lease_ttl_s:
            raise ValueError("recheck_s must be at most a third of lease_ttl_s "
                             "(it also keeps waiters alive)")
        return self


class LoggingConfig(StrictModel):
    access: bool = True  # one JSON line per request (logger slotgate.access, level INFO)
    content: bool = False  # add the prompt text the classifier reads to that line
    # Refusals of callers without a valid key: at most one line per status per interval
    # (0: every one), carrying the count of lines left out since.
    refusal_interval_s: float = Field(default=1.0, ge=0, le=3600)
    # A valid key's refusals before any engine work (4xx: malformed, over its limits...):
    # at most this many access lines and ledger rows per key per second (0: every one),
    # the next one written carrying the count left out. Metrics count every one.
    refusals_per_key_s: int = Field(default=10, ge=0, le=100_000)
