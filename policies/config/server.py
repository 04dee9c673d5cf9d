"""The `server` section: the listening socket and every bound on what a client sends.

Pure data and validation: no YAML, no files, no environment lookups.
"""

from __future__ import annotations

from pydantic import Field, ValidationInfo, field_validator

from policies.config.base import PositiveSeconds, StrictModel
from policies.headers import ForwardHeaders, TrustedProxies


class ServerConfig(StrictModel):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65_535)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024)
    max_header_bytes: int = Field(default=16 * 1024, ge=1024, le=1024 * 1024)
    max_response_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    max_messages: int = Field(default=2048, ge=1, le=1_000_000)  # per chat request
    body_read_timeout_s: PositiveSeconds = 30.0
    queue_heartbeat_s: float = Field(default=5.0, gt=0, le=5.0)
    retry_after_min_s: int = Field(default=1, ge=1, le=3600)
    retry_after_max_s: int = Field(default=60, ge=1, le=3600)
    shutdown_timeout_s: PositiveSeconds = 30.0
    forward_headers: ForwardHeaders = ()  # client headers an engine sees, beyond the built-in
    trusted_proxies: TrustedProxies = ()  # CIDRs whose X-Forwarded-*/Forwarded are kept
    # Bounds on a request's JSON, checked on its bytes before it is parsed (400 beyond);
    # orjson cannot re-encode past 254 levels, hence the ceiling.
    max_json_depth: int = Field(default=64, ge=4, le=128)
    max_json_values: int = Field(default=262_144, ge=1024, le=4_194_304)
    # Request bodies held in memory across the process (being read, queued, forwarded):
    # 503 + Retry-After for a body beyond it, before it is read.
    max_inflight_body_bytes: int = Field(default=256 * 1024 * 1024, ge=1024,
                                         le=64 * 1024 * 1024 * 1024)
    max_sequences: int = Field(default=1, ge=1, le=128)  # n x best_of x prompts per request
    max_embedding_inputs: int = Field(default=2048, ge=1, le=1_000_000)  # texts per request
    # Connection limits (router/server/connections.py), applied when the server starts.
    head_timeout_s: float = Field(default=10.0, gt=0, le=300)
    keepalive_timeout_s: float = Field(default=75.0, gt=0, le=3600)
    max_head_bytes: int = Field(default=64 * 1024, ge=4 * 1024, le=16 * 1024 * 1024)
    max_connections: int = Field(default=10_000, ge=1, le=1_000_000)
    max_connections_per_client: int = Field(default=256, ge=1, le=1_000_000)

    # A field validator rather than a model one: it still runs when another server key is
    # invalid, so a config check reports this problem alongside the others.
    @field_validator("retry_after_max_s")
    @classmethod
    def _retry_bounds(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("retry_after_min_s")
        if isinstance(low, int) and low > value:
            raise ValueError(f"must not be less than retry_after_min_s ({low})")
        return value

    @field_validator("max_inflight_body_bytes")
    @classmethod
    def _holds_one_body(cls, value: int, info: ValidationInfo) -> int:
        largest = info.data.get("max_body_bytes")
        if isinstance(largest, int) and largest > value:
            raise ValueError(f"must not be less than max_body_bytes ({largest})")
        return value

    @field_validator("max_head_bytes")
    @classmethod
    def _head_holds_a_header(cls, value: int, info: ValidationInfo) -> int:
        line = info.data.get("max_header_bytes")
        if isinstance(line, int) and line > value:
            raise ValueError(f"must not be less than max_header_bytes ({line})")
        return value
