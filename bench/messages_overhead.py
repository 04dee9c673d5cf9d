"""What translating the Anthropic Messages API costs: `/v1/messages` against
`/v1/chat/completions` through one slotgate, same run, same engine.

    .venv/bin/python bench/messages_overhead.py [--rounds 4] [--seconds 8] [--c1 300]

One gateway on the config of `make bench` (auth, access log, SQLite ledger, a steering
route) in front of the mock engine. Per round, in alternating order, for each API: wrk at
c=64 (requests/s, gateway CPU per request), then `--c1` requests one at a time (latency:
median and p99, streamed and not, alternating). The same question, `max_tokens` 16, both
ways. Prints medians, the rounds' spread and the ratios messages / chat.
"""

from __future__ import annotations

import argparse
import http.client
import shutil
import statistics
import sys
import time

import orjson
from ab import KEY, LOAD_CPU, pin, start_side
from harness import REPO
from peer_configs import MOCK_MODEL
from peers import Fleet
from suite_load import run_wrk

QUESTION = "Say hello."


def bodies() -> dict[str, tuple[str, bytes]]:
    """Per API: its path and a request body (not streamed)."""
    chat = {"model": "mock", "max_tokens": 16,
            "messages": [{"role": "user", "content": QUESTION}]}
    messages = {"model": "mock", "max_tokens": 16,
                "messages": [{"role": "user", "content": QUESTION}]}
    return {"chat": ("/v1/chat/completions", orjson.dumps(chat)),
            "messages": ("/v1/messages", orjson.dumps(messages))}


def latency(url: str, path: str, body: dict[str, object], count: int) -> list[float]:
    """Seconds per request, one at a time on one keep-alive connection, half streamed."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json",
               "anthropic-version": "2023-06-01"}
    took = []
    try:
        for i in range(count):
            payload = orjson.dumps({**body, "stream": i % 2 == 1})
            began = time.perf_counter()
            conn.request("POST", path, payload, headers)
            response = conn.getresponse()
            response.read()
            took.append(time.perf_counter() - began)
            if response.status != 200:
                raise RuntimeError(f"{path}: {response.status}")
    finally:
        conn.close()
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--c1", type=int, default=300)
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    apis = bodies()
    rows: dict[str, list[dict[str, float]]] = {api: [] for api in apis}
    with Fleet() as fleet:
        mock = fleet.mock()
        pin(mock.popen.pid, LOAD_CPU)
        server = start_side(fleet, "gateway", REPO, mock)
        for r in range(args.rounds):
            order = list(apis) if r % 2 == 0 else list(reversed(apis))
            for api in order:
                path, body = apis[api]
                url = server.url + path
                run_wrk(wrk, url, body, f"Bearer {KEY}", 64, 1, {LOAD_CPU})  # warm
                cpu0, began = server.cpu_s(), time.perf_counter()
                out = run_wrk(wrk, url, body, f"Bearer {KEY}", 64, args.seconds, {LOAD_CPU})
                cpu = server.cpu_s() - cpu0
                took = sorted(latency(server.url, path, orjson.loads(body), args.c1))
                row = {"rps": out["rps"], "cpu_us": cpu / out["requests"] * 1e6,
                       "errors": out["errors"], "p50_ms": statistics.median(took) * 1e3,
                       "p99_ms": took[int(0.99 * (len(took) - 1))] * 1e3,
                       "busy": cpu / (time.perf_counter() - began)}
                rows[api].append(row)
                print(f"round {r + 1} {api:8}: {row['rps']:7.0f} req/s {row['cpu_us']:5.0f} "
                      f"us/req, c=1 p50 {row['p50_ms']:.2f} ms p99 {row['p99_ms']:.2f} ms, "
                      f"errors {row['errors']:.0f}", flush=True)
    for key in ("rps", "cpu_us", "p50_ms", "p99_ms"):
        chat = statistics.median(r[key] for r in rows["chat"])
        msgs = statistics.median(r[key] for r in rows["messages"])
        spread = {api: (min(r[key] for r in rs), max(r[key] for r in rs))
                  for api, rs in rows.items()}
        print(f"{key:7} chat {chat:8.2f} messages {msgs:8.2f}  messages / chat x{msgs / chat:.3f}"
              f"  (rounds: chat {spread['chat'][0]:.2f}-{spread['chat'][1]:.2f}, messages "
              f"{spread['messages'][0]:.2f}-{spread['messages'][1]:.2f})")
    print(f"(model {MOCK_MODEL}; target: messages CPU per request at most x1.25 of chat)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
