"""`slotgate evaluate` (#33): a prompt file through a route's small model, its primary and
the judge, compared by the live shadows' own code (`ShadowRunner.judged`: the replay on
the primary and the pairwise judgement in both orders), so that an operator can qualify a
small model or a threshold before turning it on.

Each call goes to one backend through a *direct* route: one whose primary is that backend
and that can send nothing elsewhere (no fallbacks, no experiment on it). The calls are a
key's interactive requests at the lowest class (or of no key); each prompt's intent and
p_simple come from the gateway's classifier, as steering reads them. No prompt or answer
is logged or kept: the results are figures and labels.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import aiohttp

from classifier.model import IntentClassifier
from classifier.text import request_text
from policies.config import Config, RouteConfig
from policies.quality.judging import Verdict, language
from policies.scheduler.brevity import steering_odds
from router.common.parsed import Endpoint
from router.common.record import RequestRecord, new_id
from router.quality.prompt_file import EvalPrompt
from router.quality.shadows import Cut, Shadow, ShadowRunner
from router.upstream.capture import Capture

DIRECT_PREFIX = "evaluate."  # of a direct route the embedded gateway adds


class EvaluateError(ValueError):
    """The route, the small backend or the config cannot be evaluated as asked."""


class Outcome(enum.StrEnum):
    """What became of one prompt."""

    JUDGED = "judged"
    NO_VERDICT = "no_verdict"  # the judge's replies could not be read
    SMALL_FAILED = "small_failed"  # the small model's call answered with an error
    REPLAY_FAILED = "replay_failed"  # the primary's
    REFUSED = "refused"  # the gateway had no room for a call (429, 503)
    FAILED = "failed"  # a call got no answer (connection, timeout)


@dataclass(frozen=True, slots=True)
class Plan:
    """What is compared: the route, its small and primary backends, the judge's backend,
    and the direct route that reaches each."""

    route: str
    small: str
    primary: str
    judge: str
    direct: dict[str, str]  # backend -> its direct route


@dataclass(frozen=True, slots=True)
class Judged:
    """One prompt's result: figures and labels, never a text."""

    line: int
    label: str | None  # the file's
    intent: str  # the classifier's
    p_simple: float
    language: str
    prompt_tokens: int
    outcome: Outcome
    verdict: Verdict | None = None
    saved: float = 0.0  # the primary's answer priced, less the small model's


def direct_route(config: Config, backend: str) -> str | None:
    """A route that sends every request to `backend` alone, if the config has one."""
    tried = {e.route for e in config.experiments.values() if e.enabled}
    return next((name for name, route in config.routes.items()
                 if route.primary == backend and not route.fallbacks and name not in tried),
                None)


def backends_of(config: Config, route: str, small: str | None) -> tuple[str, str, str]:
    """(small, primary, judge) backends of `route`: its first fallback unless `small`, its
    primary, and the judge route's primary. Raises EvaluateError."""
    found = config.routes.get(route)
    if found is None:
        raise EvaluateError(f"unknown route {route!r} (known: {', '.join(config.routes)})")
    if small is None:
        if not found.fallbacks:
            raise EvaluateError(f"route {route!r} has no fallback: name the small backend "
                                "with --small")
        small = found.fallbacks[0]
    elif small not in config.backends:
        raise EvaluateError(f"unknown backend {small!r} (known: {', '.join(config.backends)})")
    if small == found.primary:
        raise EvaluateError(f"{small!r} is the route's primary: nothing to compare it with")
    judge_route = config.quality.judge_route or route
    judge = config.routes.get(judge_route)
    if judge is None:
        raise EvaluateError(f"quality.judge_route {judge_route!r} is not a route")
    return small, found.primary, judge.primary


def plan_for(config: Config, route: str, small: str | None = None) -> Plan:
    """The plan on a gateway serving `config`. Raises EvaluateError, naming the direct
    route to add when a backend has none."""
    small, primary, judge = backends_of(config, route, small)
    direct: dict[str, str] = {}
    for backend in (small, primary, judge):
        name = direct_route(config, backend)
        if name is None:
            raise EvaluateError(
                f"no route of the config sends requests to {backend!r} alone (its primary, "
                f"no fallbacks, no experiment): add one, e.g. routes: {{{backend}-direct: "
                f"{{primary: {backend}}}}}, or leave out --url to evaluate in-process")
        direct[backend] = name
    return Plan(route, small, primary, judge, direct)


def with_direct_routes(config: Config, backends: Sequence[str]) -> Config:
    """`config` with a direct route (`evaluate.<backend>`) for each of `backends` that has
    none: what the in-process gateway serves."""
    routes = dict(config.routes)
    for backend in dict.fromkeys(backends):
        if direct_route(config, backend) is None:
            base = DIRECT_PREFIX + backend
            name = next(name for n in itertools.count()
                        if (name := base + (f".{n}" if n else "")) not in routes)
            routes[name] = RouteConfig(primary=backend)
    return config.model_copy(update={"routes": routes})


async def evaluate(url: str, key: str | None, config: Config, plan: Plan,
                   prompts: Sequence[EvalPrompt], classifier: IntentClassifier,
                   concurrency: int = 4, done: Callable[[int], None] | None = None
                   ) -> list[Judged]:
    """Every prompt through the gateway at `url` (serving `config`), `concurrency` at a
    time; `done(n)` after each. Results in the file's order."""
    judge = plan.direct[plan.judge]
    view = config.model_copy(update={
        "quality": config.quality.model_copy(update={"judge_route": judge})})
    runner = ShadowRunner(lambda: view, url.rstrip("/").removesuffix("/v1"), key,
                          lambda _: None, None, own=False)
    results: list[Judged | None] = [None] * len(prompts)
    queue: Iterator[int] = iter(range(len(prompts)))
    finished = 0

    async def work() -> None:
        nonlocal finished
        for index in queue:
            results[index] = await _one(runner, config, plan, prompts[index], classifier)
            finished += 1
            if done is not None:
                done(finished)

    runner.open()
    try:
        async with asyncio.TaskGroup() as tasks:
            for _ in range(min(concurrency, len(prompts))):
                tasks.create_task(work())
    finally:
        await runner.close()
    return [r for r in results if r is not None]


async def _one(runner: ShadowRunner, config: Config, plan: Plan, prompt: EvalPrompt,
               classifier: IntentClassifier) -> Judged:
    body, rule = prompt.body, config.routes[plan.route].fallback
    text = request_text(body)
    prediction = classifier.predict(text)
    p_simple = round(steering_odds(prediction, rule.intents, body.get("max_tokens"), text), 4)

    def result(outcome: Outcome, tokens: int = 0, verdict: Verdict | None = None,
               saved: float = 0.0) -> Judged:
        return Judged(prompt.line, prompt.label, prediction.intent, p_simple, language(text),
                      tokens, outcome, verdict, saved)

    try:
        shadow = await _small_answer(runner, plan, prompt)
        if shadow is None:
            return result(Outcome.SMALL_FAILED)
        shadow.rec.intent, shadow.rec.p_simple = prediction.intent, p_simple
        tokens = shadow.rec.prompt_tokens or 0
        judged = await runner.judged(shadow)
    except Cut:
        return result(Outcome.REFUSED)
    except (aiohttp.ClientError, TimeoutError):
        return result(Outcome.FAILED)
    if judged is None:
        return result(Outcome.REPLAY_FAILED, tokens)
    verdict, saved = judged
    return result(Outcome.JUDGED if verdict is not None else Outcome.NO_VERDICT, tokens,
                  verdict, saved)


async def _small_answer(runner: ShadowRunner, plan: Plan, prompt: EvalPrompt) -> Shadow | None:
    """The small model's answer to `prompt`, as the Shadow a downgraded request would have
    left; None when it answered with an error."""
    began, ts = time.perf_counter(), time.time()
    status, answer = await runner.call(
        Endpoint.CHAT.value, {**prompt.body, "model": plan.direct[plan.small], "stream": False},
        None)
    if status != 200 or not isinstance(answer, dict):
        return None
    usage = answer.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    rec = RequestRecord(
        new_id(), Endpoint.CHAT.value, began, ts, new_id(), route=plan.direct[plan.primary],
        primary=plan.primary, backend=plan.small, status=status,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        slot_ms=(time.perf_counter() - began) * 1000)  # (its wait too, if it had one)
    capture = Capture()
    capture.answer = answer
    return Shadow(rec, Endpoint.CHAT.value, prompt.body, capture)
