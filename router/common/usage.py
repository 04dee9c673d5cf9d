"""A request's token counts as its engine reported them, accepted only within bounds, and
what the gateway saw itself for when the engine reports nothing. No I/O: the relays
(router.common.sse, the client APIs' translations) fill it in; accounting reads it."""

from __future__ import annotations

from dataclasses import dataclass

_NO_BOUND = 1 << 62


@dataclass(slots=True)
class Usage:
    """The engine's token counts, accepted only within bounds: the request's `max_prompt`
    and `max_completion` (router.request.usage.usage_bounds). Counts out of them, negative
    or not integers are `rejected`: the gateway's estimate stands in for them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    known: bool = False  # the backend reported it, within bounds
    # What the gateway saw itself, for when the backend reports nothing (a stream cut
    # short, an engine without usage): one per streamed data event, whatever it held.
    seen_events: int = 0
    max_prompt: int = _NO_BOUND
    max_completion: int = _NO_BOUND
    rejected: bool = False  # the backend reported counts out of bounds
    cached_tokens: int | None = None  # prompt tokens its prefix cache spared, if it said

    def update(self, usage: object) -> None:
        if isinstance(usage, dict):
            prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
            completion = usage.get("completion_tokens", usage.get("output_tokens"))
            if completion is None and "total_tokens" in usage:
                completion = 0  # an embedding's usage: prompt and total tokens only
            if prompt is None and completion is None:
                return
            if (type(prompt) is int and type(completion) is int  # not bool, not float
                    and 0 <= prompt <= self.max_prompt
                    and 0 <= completion <= self.max_completion):
                self.prompt_tokens = prompt
                self.completion_tokens = completion
                self.known = True
                details = usage.get("prompt_tokens_details")
                cached = details.get("cached_tokens") if isinstance(details, dict) else None
                if type(cached) is int and 0 <= cached <= prompt:
                    self.cached_tokens = cached
            else:
                self.rejected = True
