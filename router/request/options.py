"""The places a request on an objective-driven route (`fallback.when: objective`) could go,
each with its predicted time to first token and cost, for `policies.scheduler.objective.choose`.

A fallback serving the primary's own `model` is an overflow (no downgrade); any other is
the small model. Each option's TTFT is the time the request has already spent, plus its
wait for a slot there (none when one is free and nobody waits; the pool's forecast for
the place behind its line; never, when its line has no room), plus the backend's
expected time from a slot to the first byte (its answer model's, as for the request's
recorded prediction: `objective.expected_first_byte_s`). Its cost is the request priced
there: the prompt and the answer of the length that backend's answers are expected to
run to (capped by `max_tokens`), per token, or the slot time that answer takes on a
GPU-time price.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from policies.clock.lengths import OUTPUT_PRIOR
from policies.pricing.costs import request_cost
from policies.scheduler.capabilities import Lack, lack
from policies.scheduler.objective import Option, OptionKind
from router.request.objective import expected_first_byte_s

if TYPE_CHECKING:
    from policies.clock.answers import AnswerModel
    from policies.config import RouteConfig
    from router.backend import Backend
    from router.exchange import Exchange

def options(ex: Exchange, route: RouteConfig) -> list[Option]:
    """The primary's option, then each fallback's, in the route's order."""
    backends, configs = ex.gw.backends, ex.config.backends
    needs = ex.needs()
    model = configs[route.primary].model
    found = [_option(ex, backends[route.primary], OptionKind.PRIMARY, None)]
    for name in route.fallbacks:
        config = configs[name]
        kind = (OptionKind.OVERFLOW if model is not None and config.model == model
                else OptionKind.SMALL)
        found.append(_option(ex, backends[name], kind, lack(needs, config.ability)))
    return found


def _option(ex: Exchange, backend: Backend, kind: OptionKind, lacking: Lack | None) -> Option:
    parsed, pool = ex.request_body, backend.pool
    snap = pool.snapshot()
    if snap.open:
        wait_s = 0.0
    elif snap.room_for(ex.priority) > 0:
        wait_s = pool.forecast(snap.queued + 1)
    else:
        wait_s = math.inf
    spent_s = time.perf_counter() - ex.rec.started_at
    ttft_s = spent_s + wait_s + expected_first_byte_s(backend, parsed.stream, parsed.max_tokens)
    output = expected_output(backend.clock.answers, parsed.max_tokens)
    config = backend.config
    cost = request_cost(config.price, max(config.slots, 1), ex.prompt_tokens(), output,
                        backend.clock.slot_s(output))
    return Option(kind, backend.name, ttft_s, cost, lacking)


def expected_output(answers: AnswerModel, max_tokens: int | None) -> int:
    """The tokens a backend's answer is expected to run to, capped by `max_tokens`."""
    expected = answers.expected_tokens(max_tokens)
    if expected is None:
        return min(max_tokens or OUTPUT_PRIOR, OUTPUT_PRIOR)  # (a lower max_tokens counts)
    return round(expected)
