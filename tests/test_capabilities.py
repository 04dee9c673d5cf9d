"""policies.scheduler.capabilities: what a request needs (tools, vision, a JSON schema, its
size) and whether a backend serves it; and the policies that move requests honouring it."""

from __future__ import annotations

from typing import Any

import pytest

from policies.clock.lengths import OUTPUT_PRIOR
from policies.config import Overflow, RouteConfig
from policies.scheduler import admission
from policies.scheduler.capabilities import (
    ALL_CAPABILITIES,
    Ability,
    Capability,
    Lack,
    Needs,
    first_lack,
    lack,
    needs_of,
    serves,
)
from policies.scheduler.failover import Plan, Retry, Standing, Unavailable, lead, retry_on, without
from policies.slots import PoolSnapshot

TOOLS, VISION, SCHEMA = Capability.TOOLS, Capability.VISION, Capability.JSON_SCHEMA
USER = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def image(kind: str) -> dict[str, Any]:
    part: dict[str, Any] = {"type": kind}
    if kind == "image_url":
        part["image_url"] = {"url": "data:image/png;base64,AAAA"}
    else:
        part["image_url"] = "https://example.com/cat.png"
    return {"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"messages": [USER]}, set()),
        ({"prompt": "hello"}, set()),  # completions: plain text
        ({"messages": [USER], "tools": [TOOL]}, {TOOLS}),
        ({"messages": [USER], "tools": []}, set()),  # an empty list offers nothing
        ({"messages": [USER], "tools": None}, set()),
        ({"messages": [USER], "functions": [{"name": "f", "parameters": {}}]}, {TOOLS}),
        # A tool exchange in the conversation: only a tool-calling model reads it.
        ({"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "1", "content": "42"}]}, {TOOLS}),
        ({"messages": [USER, {"role": "function", "name": "f", "content": "42"}]}, {TOOLS}),
        ({"messages": [USER, {"role": "assistant", "function_call": {"name": "f"}}]},
         {TOOLS}),
        ({"messages": [image("image_url")]}, {VISION}),
        ({"messages": [image("input_image")]}, {VISION}),
        ({"messages": [image("image")]}, {VISION}),
        # Text parts alone are plain chat; odd shapes yield no need (and never raise).
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
         set()),
        ({"messages": [{"role": "user", "content": ["image_url", 3, None]}]}, set()),
        ({"messages": "hello"}, set()),
        ({"messages": [None, 3]}, set()),
        ({"messages": [USER], "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object"}}}}, {SCHEMA}),
        ({"messages": [USER], "response_format": {"type": "json_object"}}, set()),
        ({"messages": [USER], "response_format": {"type": "text"}}, set()),
        ({"messages": [USER], "response_format": "json_schema"}, set()),
        ({"messages": [image("image_url")], "tools": [TOOL],
          "response_format": {"type": "json_schema"}}, {TOOLS, VISION, SCHEMA}),
    ],
)
def test_needs_of(body: dict[str, Any], expected: set[Capability]) -> None:
    assert needs_of(body, 10, 100) == Needs(frozenset(expected), 110)


def test_size_is_the_prompt_and_the_output_budget() -> None:
    assert needs_of({}, 500, 200).tokens == 700
    assert needs_of({}, 500, None).tokens == 500 + OUTPUT_PRIOR


SMALL_PLAIN = Ability(frozenset(), 8192)
SMALL_TOOLS = Ability(frozenset({TOOLS}), 8192)
EVERYTHING = Ability()  # the default: every capability, a window unknown


@pytest.mark.parametrize(
    ("needs", "ability", "expected"),
    [
        (Needs(frozenset(), 100), SMALL_PLAIN, None),
        (Needs(frozenset({TOOLS}), 100), SMALL_PLAIN, Lack.TOOLS),
        (Needs(frozenset({TOOLS}), 100), SMALL_TOOLS, None),
        (Needs(frozenset({VISION}), 100), SMALL_TOOLS, Lack.VISION),
        (Needs(frozenset({SCHEMA}), 100), SMALL_TOOLS, Lack.JSON_SCHEMA),
        # A fixed order: tools, then vision, then json_schema, then the window.
        (Needs(frozenset({SCHEMA, VISION, TOOLS}), 10**6), SMALL_PLAIN, Lack.TOOLS),
        (Needs(frozenset({SCHEMA, VISION}), 10**6), SMALL_PLAIN, Lack.VISION),
        (Needs(frozenset(), 8192), SMALL_PLAIN, None),  # exactly the window fits
        (Needs(frozenset(), 8193), SMALL_PLAIN, Lack.CONTEXT),
        (Needs(frozenset({TOOLS, VISION, SCHEMA}), 10**9), EVERYTHING, None),
    ],
)
def test_lack(needs: Needs, ability: Ability, expected: Lack | None) -> None:
    assert lack(needs, ability) == expected
    assert serves(needs, ability) is (expected is None)


def test_defaults_serve_everything_as_before() -> None:
    assert Ability().capabilities == ALL_CAPABILITIES == {TOOLS, VISION, SCHEMA}
    assert Ability().context_window is None


def test_first_lack_only_when_none_serves() -> None:
    tools = Needs(frozenset({TOOLS}), 10)
    assert first_lack(tools, [SMALL_PLAIN, Ability(frozenset(), 10)]) is Lack.TOOLS
    assert first_lack(tools, [Ability(frozenset({TOOLS}), 1), SMALL_PLAIN]) is Lack.CONTEXT
    assert first_lack(tools, [SMALL_PLAIN, SMALL_TOOLS]) is None
    assert first_lack(tools, []) is None


# -- the moves that honour it: overflow admission and failover --------------------------------

FULL = PoolSnapshot("big", 2, 2, 4, 4, 10.0)  # no slot, no queue room
SMALL_FREE = PoolSnapshot("small", 4, 0, 0, 4, 5.0)
EDGE_FREE = PoolSnapshot("edge", 4, 0, 0, 4, 5.0)


def overflow(able: set[str] | None) -> admission.Decision:
    return admission.decide(FULL, [SMALL_FREE, EDGE_FREE], Overflow.FALLBACK,
                            forecast=lambda pool: 3.0, able=able)


def test_overflow_skips_a_fallback_that_cannot_serve() -> None:
    assert overflow(None) == admission.Run("small", admission.RouteReason.OVERFLOW)
    assert overflow({"big", "edge"}) == admission.Run("edge", admission.RouteReason.OVERFLOW)
    refused = overflow({"big"})  # none can: the 429 it would get with no fallback
    assert isinstance(refused, admission.Reject)
    assert refused.reason is admission.RejectReason.QUEUE_FULL


ABC = RouteConfig(primary="a", fallbacks=("b", "c"), overflow=Overflow.REJECT)
CHAIN = ["a", "b", "c"]
UP, DOWN = Standing.UP, Standing.DOWN


def led(*names: str) -> RouteConfig:
    return ABC.model_copy(update={"primary": names[0], "fallbacks": names[1:],
                                  "overflow": Overflow.FALLBACK})


@pytest.mark.parametrize(
    ("standing", "able", "expected"),
    [
        ({"a": DOWN, "b": UP, "c": UP}, {"a", "b", "c"}, Plan(led("b", "c"))),
        ({"a": DOWN, "b": UP, "c": UP}, {"a", "c"}, Plan(led("c"))),  # b lacks: skipped
        ({"a": DOWN, "b": UP, "c": DOWN}, {"a", "c"}, Unavailable("a")),  # the 503 of today
        ({"a": DOWN, "b": UP, "c": UP}, {"a"}, Unavailable("a")),
        ({"a": UP, "b": UP, "c": UP}, {"a"}, Plan(ABC)),  # the primary is never questioned
    ],
)
def test_failover_leads_only_with_a_backend_that_serves(
        standing: dict[str, Standing], able: set[str], expected: Plan | Unavailable) -> None:
    assert lead(ABC, CHAIN, standing, able) == expected


def test_the_rest_of_a_route_and_retries_skip_a_backend_that_cannot_serve() -> None:
    assert without(ABC, "a", {"a", "c"}) == led("c")
    assert without(ABC, "a", {"a"}) is None
    assert without(led("c"), "c", {"a", "c"}) is None
    up = {"a": UP, "b": UP, "c": UP}
    assert retry_on(CHAIN, "a", up, 0, 0, able={"a", "c"}) == Retry("c")
    assert retry_on(CHAIN, "a", up, 0, 0, able={"a"}) is None
    assert retry_on(CHAIN, "a", up, 0, 0, sibling=True, able={"a"}) == Retry("a")
