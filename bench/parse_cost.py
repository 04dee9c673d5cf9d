"""What parsing a request body costs, and what the checks made before parsing add.

For bodies from a one-line chat request up to the largest `max_body_bytes` allows (8 MiB by
default), made of text or of tiny JSON values: the time orjson takes to parse each (the
baseline), the time of `router.request.json_bounds.check_bounds` (which runs first, so a body it
refuses is never parsed) and of the gateway's whole parse (`parse_request`: the checks,
then orjson with the cyclic GC paused for a large body), as ratios to that baseline in
the same run, and the memory the parsed form holds as a multiple of the body's size.
Best of several runs each; no I/O.

    .venv/bin/python bench/parse_cost.py [--runs 7]
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable

import orjson

from policies.config import ServerConfig
from router.common.errors import ApiError
from router.common.parsed import Endpoint
from router.openai_api import parse_request
from router.request.json_bounds import check_bounds

MiB = 1 << 20


HEAD = b'{"model":"chat","messages":[{"role":"user","content":"hi"}],"x":['


def bodies(size: int) -> dict[str, bytes]:
    head = HEAD
    def flood(item: bytes) -> bytes:
        count = (size - len(head) - 2) // (len(item) + 1)
        return head + b",".join([item] * count) + b"]}"

    prose = "The quick brown fox, 1234, jumps: over the lazy dog. " * (size // 53)
    turns = [{"role": "user" if i % 2 else "assistant",
              "content": "How are you? Fine, thanks. " * 20} for i in range(200)]
    return {
        "chat, 1 message (84 B)": orjson.dumps({"model": "chat", "messages": [
            {"role": "user", "content": "Say hello."}], "max_tokens": 16}),
        "chat, 200 messages (110 KiB)": orjson.dumps({"model": "chat", "messages": turns}),
        "prompt, 131,072 token ids": orjson.dumps({"model": "chat",
                                                   "prompt": list(range(131_072))}),
        "text, 8 MiB": orjson.dumps({"model": "chat", "messages": [
            {"role": "user", "content": prose[:size - 100]}]}),
        "131,000 x [] (within the default cap)": head + b",".join([b"[]"] * 131_000) + b"]}",
        "8 MiB of 0,0,0": flood(b"0"),
        "8 MiB of {},{},{}": flood(b"{}"),
        "8 MiB of [],[],[]": flood(b"[]"),
    }


def best(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def parsed_bytes(raw: bytes) -> int:
    gc.collect()
    tracemalloc.start()
    value = orjson.loads(raw)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del value
    return held


def gateway_parse(raw: bytes, limits: ServerConfig) -> None:
    """What the gateway does with a body: the checks, then orjson (GC paused when large)."""
    try:
        parse_request(raw, Endpoint.CHAT, limits)
    except ApiError:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    limits = ServerConfig()
    depth, values = limits.max_json_depth, limits.max_json_values
    print(f"limits: max_json_depth {depth}, max_json_values {values:,}; best of {args.runs}")
    print("| body | size | orjson.loads (ms) | checks (ms) | checks / loads | gateway parse "
          "(ms) | gateway / loads | parsed memory / size | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, raw in bodies(limits.max_body_bytes).items():
        loads = best(lambda raw=raw: orjson.loads(raw), args.runs)
        checks = best(lambda raw=raw: check_bounds(raw, depth, values), args.runs)
        gateway = best(lambda raw=raw: gateway_parse(raw, limits), args.runs)
        breach = check_bounds(raw, depth, values)
        verdict = "passes" if breach is None else "400: " + breach.message.split(";")[0]
        amplification = parsed_bytes(raw) / len(raw)
        size = f"{len(raw) / MiB:.1f} MiB" if len(raw) > MiB else f"{len(raw):,} B"
        print(f"| {name} | {size} | {loads * 1000:.3f} | {checks * 1000:.3f} | "
              f"{checks / loads:.2f} | {gateway * 1000:.3f} | {gateway / loads:.2f} | "
              f"{amplification:.1f}x | {verdict} |")


if __name__ == "__main__":
    main()
