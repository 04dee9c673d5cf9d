"""The `routes` and `experiments` sections: public model names, their backends and
fallbacks, A/B arms, and the checks between sections.

Pure data and validation: no YAML, no files, no environment lookups.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Mapping
from typing import Literal

from pydantic import Field, field_validator

from policies.apis import GENERATIVE_APIS, Api
from policies.config.base import Loc, Overflow, StrictModel
from policies.config.quality import RouteQualityConfig
from policies.config.slo import RouteSloConfig

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
    # while the primary has no free slot: the cheapest of waiting, the small model or an
    # overflow backend that meets the class's TTFT objective (`policies.scheduler.objective`)
    OBJECTIVE = "objective"


class RouteFallbackConfig(StrictModel):
    when: FallbackWhen = FallbackWhen.SATURATED
    intents: frozenset[Intent] = Field(default=frozenset(SIMPLE_INTENTS), min_length=1)
    min_confidence: float = Field(default=0.8, ge=0.0, le=1.0)


class HostedTools(enum.StrEnum):
    """What a translated Responses request's hosted tools (web_search, file_search...: tools
    the server would run, which a chat engine cannot) become."""

    DROP = "drop"  # left out of what the engine sees, named in a header and the log
    REFUSE = "refuse"  # 400, naming the tool


class RouteResponsesConfig(StrictModel):
    """How the route serves the OpenAI Responses API (docs/responses-api.md)."""

    hosted_tools: HostedTools = HostedTools.DROP
    # Passed through to an engine that serves Responses itself: may `store: true` and
    # `previous_response_id` reach it? Off: `store` is sent as false and a
    # `previous_response_id` is refused, since the engine's account is every tenant's.
    stored: bool = False


class RouteConfig(StrictModel):
    primary: str
    fallbacks: tuple[str, ...] = ()
    overflow: Overflow = Overflow.FALLBACK
    fallback: RouteFallbackConfig = RouteFallbackConfig(when=FallbackWhen.NEVER)
    slo: RouteSloConfig = RouteSloConfig()  # the classes it names override the top level's
    responses: RouteResponsesConfig = RouteResponsesConfig()
    quality: RouteQualityConfig = RouteQualityConfig()  # shadow comparisons (#33)


def cross_check(
    backends: Collection[str], routes: Mapping[str, RouteConfig],
    apis: Mapping[str, frozenset[Api]] | None = None,
) -> list[tuple[Loc, str]]:
    """Problems between sections, each with the key path it is about (empty if none);
    with `apis` (what each backend serves), the routes' APIs are checked too."""
    known = ", ".join(backends) or "none"
    problems: list[tuple[Loc, str]] = []
    for name, route in routes.items():
        if route.primary not in backends:
            problems.append(
                (("routes", name, "primary"), f"unknown backend {route.primary!r} (known: {known})")
            )
        elif apis is not None:
            problems.extend(_api_problems(name, route, apis))
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


def _api_problems(name: str, route: RouteConfig,
                  apis: Mapping[str, frozenset[Api]]) -> list[tuple[Loc, str]]:
    """An embeddings-only primary is never steered (the classifier reads no text to embed),
    and a fallback must serve one of the primary's APIs to ever take its requests."""
    problems: list[tuple[Loc, str]] = []
    served = apis.get(route.primary, frozenset())
    if (route.fallback.when is not FallbackWhen.NEVER and Api.EMBEDDINGS in served
            and not served & GENERATIVE_APIS):
        problems.append((("routes", name, "fallback", "when"),
                         f"{route.primary!r} serves only embeddings: intent steering does "
                         "not apply to them; use 'never' (overflow still uses 'fallbacks')"))
    for index, target in enumerate(route.fallbacks):
        if target in apis and target != route.primary and not apis[target] & served:
            problems.append((("routes", name, "fallbacks", index),
                             f"{target!r} serves none of the APIs of the primary "
                             f"{route.primary!r} ({', '.join(sorted(served))})"))
    return problems


class ArmFallbackConfig(StrictModel):
    """An arm's changes to a route's `fallback` section; what it leaves out stays."""

    when: FallbackWhen | None = None
    intents: frozenset[Intent] | None = Field(default=None, min_length=1)
    min_confidence: float | None = Field(default=None, ge=0.0, le=1.0)


class ArmConfig(StrictModel):
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


class ExperimentConfig(StrictModel):
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
    routes: Mapping[str, RouteConfig], apis: Mapping[str, frozenset[Api]] | None = None,
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
            for loc, message in cross_check(backends, {exp.route: arm.apply(route)}, apis):
                where: Loc = ("experiments", name, "arms", arm_name, *loc[2:])
                problems.append((where, message))
    return problems
