"""The typed, frozen configuration models.

Pure data and validation: no YAML, no files, no environment lookups here
(`router.config` turns a file into these models). Unknown keys are errors.
"""

from __future__ import annotations

import enum
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, model_validator

PositiveSeconds = Annotated[float, Field(gt=0, le=86_400)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Overflow(enum.StrEnum):
    """What a route does when its primary's queue is full."""

    FALLBACK = "fallback"
    REJECT = "reject"


class ServerConfig(_Model):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65_535)
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024)
    max_header_bytes: int = Field(16 * 1024, ge=1024, le=1024 * 1024)
    max_response_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    body_read_timeout_s: PositiveSeconds = 30.0
    queue_heartbeat_s: float = Field(5.0, gt=0, le=5.0)
    retry_after_min_s: int = Field(1, ge=1, le=3600)
    retry_after_max_s: int = Field(60, ge=1, le=3600)
    shutdown_timeout_s: PositiveSeconds = 30.0

    @model_validator(mode="after")
    def _retry_bounds(self) -> Self:
        if self.retry_after_min_s > self.retry_after_max_s:
            raise ValueError("retry_after_min_s must not exceed retry_after_max_s")
        return self


class SimulatedSpec(_Model):
    """An in-process simulated engine standing in for a real backend."""

    max_num_seqs: int = Field(4, ge=1, le=4096)
    ttft_s: float = Field(0.2, ge=0, le=600)
    prefill_s_per_token: float = Field(0.0, ge=0, le=1)
    tokens_per_s: float = Field(30.0, ge=0, le=1_000_000)  # 0 = no decode delay
    batch_slowdown: float = Field(0.0, ge=0, le=10)  # decode slows by this per extra sequence
    output_tokens: int = Field(64, ge=1, le=1_000_000)  # mean length when max_tokens allows
    output_tokens_spread: float = Field(0.0, ge=0, le=1)  # uniform +/- fraction of the mean
    seed: int | None = None


class BackendConfig(_Model):
    url: HttpUrl | None = None
    simulated: SimulatedSpec | None = None
    model: str = Field(min_length=1, max_length=256)
    slots: int = Field(ge=1, le=100_000)
    queue_limit: int = Field(0, ge=0, le=100_000)
    queue_timeout_s: PositiveSeconds = 60.0
    context_window: int | None = Field(None, ge=1)
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    connect_timeout_s: PositiveSeconds = 5.0
    first_byte_timeout_s: PositiveSeconds = 60.0
    idle_timeout_s: PositiveSeconds = 60.0
    initial_hold_s: PositiveSeconds = 10.0  # slot holding time assumed before any is measured

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        if (self.url is None) == (self.simulated is None):
            raise ValueError("give exactly one of 'url' or 'simulated'")
        return self


class RouteConfig(_Model):
    primary: str
    fallbacks: tuple[str, ...] = ()
    overflow: Overflow = Overflow.FALLBACK


class Config(_Model):
    server: ServerConfig = ServerConfig()
    backends: dict[str, BackendConfig] = Field(min_length=1)
    routes: dict[str, RouteConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _routes_name_backends(self) -> Self:
        problems: list[str] = []
        for name, route in self.routes.items():
            for target in (route.primary, *route.fallbacks):
                if target not in self.backends:
                    problems.append(f"route {name!r} names unknown backend {target!r}")
            if route.primary in route.fallbacks:
                problems.append(f"route {name!r} lists its primary among its fallbacks")
            if len(set(route.fallbacks)) != len(route.fallbacks):
                problems.append(f"route {name!r} lists a fallback twice")
        if problems:
            raise ValueError("; ".join(problems))
        return self
