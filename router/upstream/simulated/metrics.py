"""The simulated engine's `GET /metrics`: the few vLLM gauges and counters a gateway or a
benchmark reads of an engine, under vLLM's names, written as Prometheus text by hand.

`vllm:kv_cache_usage_perc` stands in with the running sequences' share of `max_num_seqs`
(0-1): the engine's load, as a real engine's KV usage tracks it. The prefix-cache counters
are in prompt tokens, as vLLM counts them, and stay 0 without a prefix cache.
"""

from __future__ import annotations

from router.upstream.simulated.engine import SimEngine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def exposition(engine: SimEngine) -> str:
    """The engine's metrics now, each labelled with its `model_name`."""
    cache = engine.cache
    queries, hits = (cache.queries, cache.hits) if cache is not None else (0, 0)
    label = f'{{model_name="{_label(engine.model)}"}}'
    families = (
        ("vllm:num_requests_running", "gauge", "Requests running on the engine.",
         "", engine.running),
        ("vllm:num_requests_waiting", "gauge", "Requests waiting for a sequence.",
         "", engine.waiting),
        ("vllm:kv_cache_usage_perc", "gauge",
         "KV-cache usage, 0-1 (simulated: running sequences over max_num_seqs).",
         "", engine.running / engine.spec.max_num_seqs),
        ("vllm:prefix_cache_queries", "counter", "Prompt tokens looked up in the prefix cache.",
         "_total", queries),
        ("vllm:prefix_cache_hits", "counter", "Prompt tokens found in the prefix cache.",
         "_total", hits),
    )
    lines: list[str] = []
    for name, kind, help_text, suffix, value in families:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}",
                  f"{name}{suffix}{label} {value}"]
    return "\n".join(lines) + "\n"
