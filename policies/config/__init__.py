"""The typed, frozen configuration models: `Config`, the whole document, and its sections
in modules of their own (server, backends, routes, services, auth, slo; base holds what they
share). Everything is importable from here.

Pure data and validation: no YAML, no files, no environment lookups here
(`router.config` turns a file into these models). Unknown keys are errors.
"""

from __future__ import annotations

from typing import Self

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from policies.config.auth import ApiKeyConfig, AuthConfig, BudgetConfig, KeyScope, Public
from policies.config.backends import (
    AffinityConfig,
    BackendConfig,
    EndpointConfig,
    NonNegativeMoney,
    PriceConfig,
    QueueOrder,
    RatesHint,
    SignalsConfig,
    SimulatedSpec,
    SystemMessages,
    target_problem,
)
from policies.config.base import (
    CROSS_REFERENCE,
    Loc,
    Overflow,
    PositiveSeconds,
    Priority,
    StrictModel,
)
from policies.config.batch import BatchConfig
from policies.config.fleet import FleetConfig
from policies.config.quality import QualityConfig
from policies.config.routes import (
    COMPLEX_INTENTS,
    SIMPLE_INTENTS,
    ArmConfig,
    ArmFallbackConfig,
    ExperimentConfig,
    FallbackWhen,
    HostedTools,
    Intent,
    RouteConfig,
    RouteFallbackConfig,
    RouteResponsesConfig,
    check_experiments,
    cross_check,
)
from policies.config.server import ServerConfig
from policies.config.services import (
    CoordinationConfig,
    CoordinationMode,
    LedgerConfig,
    LoggingConfig,
    RedisDown,
)
from policies.config.slo import ClassObjective, RouteSloConfig, SloConfig
from policies.config.tracing import OtlpProtocol, TracingConfig

__all__ = [
    "COMPLEX_INTENTS",
    "CROSS_REFERENCE",
    "SIMPLE_INTENTS",
    "AffinityConfig",
    "ApiKeyConfig",
    "ArmConfig",
    "ArmFallbackConfig",
    "AuthConfig",
    "BackendConfig",
    "BatchConfig",
    "BudgetConfig",
    "ClassObjective",
    "Config",
    "CoordinationConfig",
    "CoordinationMode",
    "EndpointConfig",
    "ExperimentConfig",
    "FallbackWhen",
    "HostedTools",
    "Intent",
    "KeyScope",
    "LedgerConfig",
    "Loc",
    "LoggingConfig",
    "NonNegativeMoney",
    "OtlpProtocol",
    "Overflow",
    "PositiveSeconds",
    "PriceConfig",
    "Priority",
    "Public",
    "QueueOrder",
    "RatesHint",
    "RedisDown",
    "RouteConfig",
    "RouteFallbackConfig",
    "RouteResponsesConfig",
    "RouteSloConfig",
    "ServerConfig",
    "SignalsConfig",
    "SimulatedSpec",
    "SloConfig",
    "StrictModel",
    "SystemMessages",
    "TracingConfig",
    "check_experiments",
    "cross_check",
    "target_problem",
]


class Config(StrictModel):
    server: ServerConfig = ServerConfig()
    logging: LoggingConfig = LoggingConfig()
    backends: dict[str, BackendConfig] = Field(min_length=1)
    routes: dict[str, RouteConfig] = Field(min_length=1)
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")  # of every price
    ledger: LedgerConfig = LedgerConfig()
    batch: BatchConfig = BatchConfig()  # the Files and Batches APIs (with a ledger)
    quality: QualityConfig = QualityConfig()  # shadow comparisons (routes' shadow_rate)
    fleet: FleetConfig = FleetConfig()  # the backends' desired replica counts (scaling)
    experiments: dict[str, ExperimentConfig] = Field(default_factory=dict)
    coordination: CoordinationConfig = CoordinationConfig()
    auth: AuthConfig = AuthConfig()
    slo: SloConfig = SloConfig()  # each priority class's TTFT objective
    tracing: TracingConfig = TracingConfig()  # OpenTelemetry traces (off by default)

    @model_validator(mode="after")
    def _routes_name_backends(self) -> Self:
        # One pydantic error per problem, each at its own key path, so callers can point at it.
        apis = {name: backend.served_apis for name, backend in self.backends.items()}
        errors = [
            InitErrorDetails(
                type=PydanticCustomError(CROSS_REFERENCE, "{message}", {"message": message}),
                loc=loc,
                input=None,
            )
            for loc, message in [
                *cross_check(self.backends.keys(), self.routes, apis),
                *check_experiments(self.experiments, self.backends.keys(), self.routes, apis),
                *self._group_problems(),
                *[(("batch", "backend_max_share", name), f"no backend is named {name!r}")
                  for name in self.batch.backend_max_share if name not in self.backends],
                *[(("quality", "judge_route"), f"no route is named {judge!r}")
                  for judge in [self.quality.judge_route]
                  if judge is not None and judge not in self.routes],
            ]
        ]
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    def _group_problems(self) -> list[tuple[Loc, str]]:
        """Replica names unique within each group (given and default ones alike)."""
        problems: list[tuple[Loc, str]] = []
        for name, backend in self.backends.items():
            names = [e.name for e in backend.replicas(name)]
            if len(names) != len(set(names)):
                problems.append((("backends", name, "endpoints"),
                                 "endpoint names must be unique within a backend "
                                 f"(defaults are {name}-0, {name}-1, ...)"))
        return problems
