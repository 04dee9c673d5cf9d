"""A backend's `scaling` and the `fleet` section: the desired replica count the gateway
computes for an autoscaler (policies/fleet/desired.py, #34). Pure data and validation."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from policies.config.base import StrictModel


class BackendScalingConfig(StrictModel):
    floor: int = Field(default=1, ge=0, le=10_000)  # 0: the backend may scale to zero
    ceiling: int = Field(default=8, ge=1, le=10_000)
    # Of a replica's slots the arriving work may fill on average (headroom for bursts).
    utilization: float = Field(default=0.8, gt=0, le=1)
    # A smaller count is asked for only after this long of wanting no more.
    cooldown_s: float = Field(default=300.0, ge=0, le=86_400)

    @model_validator(mode="after")
    def _floor_below_ceiling(self) -> Self:
        if self.floor > self.ceiling:
            raise ValueError(f"floor ({self.floor}) is above ceiling ({self.ceiling})")
        return self


class FleetConfig(StrictModel):
    refresh_s: float = Field(default=15.0, gt=0, le=3600)  # how often the counts are computed
