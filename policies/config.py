"""The typed, frozen configuration models.

Pure data and validation: no YAML, no files, no environment lookups here
(`router.config` turns a file into these models). Unknown keys are errors.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Mapping
from typing import Annotated, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    HttpUrl,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from policies.headers import ForwardHeaders, TrustedProxies

# A key path into the config document, as pydantic spells it: ("routes", "chat", "fallbacks", 1).
Loc = tuple[str | int, ...]

# The error type of cross-reference problems, so a loader can tell whether they were checked.
CROSS_REFERENCE = "cross_reference"

PositiveSeconds = Annotated[float, Field(gt=0, le=86_400)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Priority(enum.StrEnum):
    """A caller's class in the queues: higher classes are served first, FIFO within one;
    `sheddable` waiters are the first to give up their place when a queue is full."""

    CRITICAL = "critical"
    STANDARD = "standard"
    SHEDDABLE = "sheddable"

    @property
    def rank(self) -> int:  # 0 is served first
        return _PRIORITY_RANK[self]


_PRIORITY_RANK = {Priority.CRITICAL: 0, Priority.STANDARD: 1, Priority.SHEDDABLE: 2}


class Overflow(enum.StrEnum):
    """What a route does when its primary's queue is full."""

    FALLBACK = "fallback"
    REJECT = "reject"


class ServerConfig(_Model):
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


class SimulatedSpec(_Model):
    """An in-process simulated engine standing in for a real backend."""

    max_num_seqs: int = Field(default=4, ge=1, le=4096)
    ttft_s: float = Field(default=0.2, ge=0, le=600)
    prefill_s_per_token: float = Field(default=0.0, ge=0, le=1)
    tokens_per_s: float = Field(default=30.0, ge=0, le=1_000_000)  # 0 = no decode delay
    # decode slows by this fraction per extra sequence in the batch
    batch_slowdown: float = Field(default=0.0, ge=0, le=10)
    output_tokens: int = Field(default=64, ge=1, le=1_000_000)  # mean length when max_tokens allows
    output_tokens_spread: float = Field(default=0.0, ge=0, le=1)  # uniform +/- fraction of the mean
    seed: int | None = None


NonNegativeMoney = Annotated[float, Field(ge=0, le=1_000_000)]


class PriceConfig(_Model):
    """Per token (hosted APIs) or per GPU time (self-hosted engines), in `Config.currency`.

    GPU time becomes a slot-second price: gpu_hour x gpus / 3600 / slots.
    """

    input_per_mtok: NonNegativeMoney | None = None
    output_per_mtok: NonNegativeMoney | None = None
    gpu_hour: NonNegativeMoney | None = None
    gpus: float | None = Field(default=None, gt=0, le=100_000)

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        per_token = (self.input_per_mtok, self.output_per_mtok)
        per_gpu = (self.gpu_hour, self.gpus)
        if any(v is not None for v in per_token) and any(v is not None for v in per_gpu):
            raise ValueError("give per-token prices (input_per_mtok, output_per_mtok) "
                             "or GPU time (gpu_hour, gpus), not both")
        if any(v is not None for v in per_token):
            if None in per_token:
                raise ValueError("per-token pricing needs both input_per_mtok and "
                                 "output_per_mtok")
        elif None in per_gpu:
            raise ValueError("give input_per_mtok and output_per_mtok, "
                             "or gpu_hour and gpus")
        return self


def target_problem(url: object, simulated: object) -> str | None:
    """A backend is either a real engine at `url` or an in-process simulated one."""
    if (url is None) == (simulated is None):
        return "give exactly one of 'url' or 'simulated'"
    if isinstance(url, HttpUrl) and (url.username or url.password):
        return "no credentials in 'url': put the key in the environment (api_key_env)"
    return None


class BackendConfig(_Model):
    url: HttpUrl | None = None
    simulated: SimulatedSpec | None = None
    model: str = Field(min_length=1, max_length=256)
    slots: int = Field(ge=1, le=100_000)
    queue_limit: int = Field(default=0, ge=0, le=100_000)
    queue_timeout_s: PositiveSeconds = 60.0
    context_window: int | None = Field(default=None, ge=1)
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    connect_timeout_s: PositiveSeconds = 5.0
    first_byte_timeout_s: PositiveSeconds = 60.0
    idle_timeout_s: PositiveSeconds = 60.0
    initial_hold_s: PositiveSeconds = 10.0  # slot holding time assumed before any is measured
    breaker_failures: int = Field(default=5, ge=1, le=1000)  # consecutive, to stop using it
    breaker_open_s: PositiveSeconds = 30.0  # then one probe request per period
    # A non-streaming request whose client left: close the upstream connection and free the
    # slot at once ("abort"), or keep the slot and read the answer to its end ("drain", for
    # engines that finish such work anyway). A cut stream is always closed upstream.
    on_disconnect: Literal["abort", "drain"] = "abort"
    price: PriceConfig | None = None  # None: the ledger counts this backend as free

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        if problem := target_problem(self.url, self.simulated):
            raise ValueError(problem)
        return self


# The intent classifier's labels; the simple ones may go to a small model.
Intent = Literal[
    "greeting", "chitchat", "rewrite", "translate", "summarize", "extract", "classify",
    "simple_qa", "brainstorm", "explain", "creative_writing", "math", "code", "reasoning",
]
SIMPLE_INTENTS: tuple[Intent, ...] = (
    "greeting", "chitchat", "rewrite", "translate", "summarize", "extract", "classify",
    "simple_qa", "brainstorm",
)
COMPLEX_INTENTS: tuple[Intent, ...] = ("explain", "creative_writing", "math", "code", "reasoning")


class FallbackWhen(enum.StrEnum):
    """When a route's simple requests may go to its fallbacks."""

    SATURATED = "saturated"  # only when they would otherwise wait for the primary
    ALWAYS = "always"  # every simple request, whatever the load
    NEVER = "never"  # only overflow (primary queue full) uses the fallbacks


class RouteFallbackConfig(_Model):
    when: FallbackWhen = FallbackWhen.SATURATED
    intents: frozenset[Intent] = Field(default=frozenset(SIMPLE_INTENTS), min_length=1)
    min_confidence: float = Field(default=0.8, ge=0.0, le=1.0)


class RouteConfig(_Model):
    primary: str
    fallbacks: tuple[str, ...] = ()
    overflow: Overflow = Overflow.FALLBACK
    fallback: RouteFallbackConfig = RouteFallbackConfig(when=FallbackWhen.NEVER)


def cross_check(
    backends: Collection[str], routes: Mapping[str, RouteConfig]
) -> list[tuple[Loc, str]]:
    """Problems between sections, each with the key path it is about (empty if none)."""
    known = ", ".join(backends) or "none"
    problems: list[tuple[Loc, str]] = []
    for name, route in routes.items():
        if route.primary not in backends:
            problems.append(
                (("routes", name, "primary"), f"unknown backend {route.primary!r} (known: {known})")
            )
        if route.fallback.when is not FallbackWhen.NEVER and not route.fallbacks:
            problems.append(
                (("routes", name, "fallback", "when"),
                 f"{route.fallback.when.value!r} needs at least one backend in 'fallbacks'")
            )
        seen: dict[str, int] = {}
        for index, target in enumerate(route.fallbacks):
            loc: Loc = ("routes", name, "fallbacks", index)
            if target == route.primary:
                problems.append((loc, f"{target!r} is this route's primary, not a fallback"))
            elif target in seen:
                problems.append((loc, f"{target!r} is already fallbacks[{seen[target]}]"))
            elif target not in backends:
                problems.append((loc, f"unknown backend {target!r} (known: {known})"))
            seen.setdefault(target, index)
    return problems


class ArmFallbackConfig(_Model):
    """An arm's changes to a route's `fallback` section; what it leaves out stays."""

    when: FallbackWhen | None = None
    intents: frozenset[Intent] | None = Field(default=None, min_length=1)
    min_confidence: float | None = Field(default=None, ge=0.0, le=1.0)


class ArmConfig(_Model):
    """One arm of an experiment: a weight and the route settings it overrides."""

    weight: float = Field(default=1.0, gt=0, le=1_000_000)
    fallbacks: tuple[str, ...] | None = None
    overflow: Overflow | None = None
    fallback: ArmFallbackConfig | None = None

    def apply(self, route: RouteConfig) -> RouteConfig:
        """The route as this arm runs it."""
        update: dict[str, object] = {}
        if self.fallbacks is not None:
            update["fallbacks"] = self.fallbacks
        if self.overflow is not None:
            update["overflow"] = self.overflow
        if self.fallback is not None:
            changes = self.fallback.model_dump(exclude_none=True)
            update["fallback"] = route.fallback.model_copy(update=changes)
        return route.model_copy(update=update)


class ExperimentConfig(_Model):
    """Requests to `route` are split between arms, sticky per subject (user, key, header)."""

    route: str
    enabled: bool = True
    arms: dict[str, ArmConfig] = Field(min_length=2, max_length=16)

    @field_validator("arms")
    @classmethod
    def _arm_names(cls, arms: dict[str, ArmConfig]) -> dict[str, ArmConfig]:
        for name in arms:
            if not _NAME.match(name):
                raise ValueError(f"arm name {name!r} must match {_NAME.pattern}")
        return arms


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_experiments(
    experiments: Mapping[str, ExperimentConfig], backends: Collection[str],
    routes: Mapping[str, RouteConfig],
) -> list[tuple[Loc, str]]:
    """Each enabled experiment names a route, at most one per route, and every arm's
    route passes the same checks as a configured one."""
    problems: list[tuple[Loc, str]] = []
    claimed: dict[str, str] = {}
    for name, exp in experiments.items():
        if not _NAME.match(name):
            problems.append((("experiments", name), f"name must match {_NAME.pattern}"))
        route = routes.get(exp.route)
        if route is None:
            problems.append((("experiments", name, "route"),
                             f"unknown route {exp.route!r} (known: {', '.join(routes)})"))
            continue
        if not exp.enabled:
            continue
        if exp.route in claimed:
            problems.append((("experiments", name, "route"),
                             f"route {exp.route!r} is already split by {claimed[exp.route]!r}"))
        claimed.setdefault(exp.route, name)
        for arm_name, arm in exp.arms.items():
            for loc, message in cross_check(backends, {exp.route: arm.apply(route)}):
                where: Loc = ("experiments", name, "arms", arm_name, *loc[2:])
                problems.append((where, message))
    return problems


class LedgerConfig(_Model):
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


class CoordinationConfig(_Model):
    mode: CoordinationMode = CoordinationMode.LOCAL
    url: str | None = Field(default=None, pattern=r"^(rediss?|unix)://", max_length=4096)
    url_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")  # secret
    key_prefix: str = Field(default="slotgate", pattern=r"^[A-Za-z0-9._:-]{1,64}$")
    lease_ttl_s: float = Field(default=15.0, ge=1.0, le=600)  # renewed every ttl/3
    call_timeout_s: float = Field(default=0.5, gt=0, le=10)  # every Redis call
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


class BudgetConfig(_Model):
    """What one key may spend per calendar period (UTC): tokens, cost, or both."""

    period: Literal["hour", "day", "month"]
    tokens: int | None = Field(default=None, ge=1)  # prompt + completion
    cost: float | None = Field(default=None, gt=0)  # in the config's currency

    @model_validator(mode="after")
    def _some_limit(self) -> Self:
        if self.tokens is None and self.cost is None:
            raise ValueError("a budget needs 'tokens', 'cost' or both")
        return self


class ApiKeyConfig(_Model):
    """One client key: stored as its SHA-256 (hex), or read from an environment variable."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # in the ledger and logs
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    tenant: str = Field(min_length=1, max_length=64)
    admin: bool = False  # may call /admin/*
    priority: Priority = Priority.STANDARD
    max_concurrent: int | None = Field(default=None, ge=1, le=100_000)  # per gateway process
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


class AuthConfig(_Model):
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


class LoggingConfig(_Model):
    access: bool = True  # one JSON line per request (logger slotgate.access, level INFO)
    content: bool = False  # add the prompt text the classifier reads to that line
    # Refusals of callers without a valid key: at most one line per status per interval
    # (0: every one), carrying the count of lines left out since.
    refusal_interval_s: float = Field(default=1.0, ge=0, le=3600)


class Config(_Model):
    server: ServerConfig = ServerConfig()
    logging: LoggingConfig = LoggingConfig()
    backends: dict[str, BackendConfig] = Field(min_length=1)
    routes: dict[str, RouteConfig] = Field(min_length=1)
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")  # of every price
    ledger: LedgerConfig = LedgerConfig()
    experiments: dict[str, ExperimentConfig] = Field(default_factory=dict)
    coordination: CoordinationConfig = CoordinationConfig()
    auth: AuthConfig = AuthConfig()

    @model_validator(mode="after")
    def _routes_name_backends(self) -> Self:
        # One pydantic error per problem, each at its own key path, so callers can point at it.
        errors = [
            InitErrorDetails(
                type=PydanticCustomError(CROSS_REFERENCE, "{message}", {"message": message}),
                loc=loc,
                input=None,
            )
            for loc, message in [
                *cross_check(self.backends.keys(), self.routes),
                *check_experiments(self.experiments, self.backends.keys(), self.routes),
            ]
        ]
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self
