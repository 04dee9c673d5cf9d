"""The gateways of the batch bench (bench/batch_share.py): the embedded config.yaml served
in-process, its ledger in a temporary folder, and what the bench reads of them: the 70B's
slot pool, its simulated engine and every record that engine made.

The 70B's answer lengths are drawn by the client (each request's `max_tokens`, from the
engine's own range) so that two gateways given the same seed see the same lengths.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import orjson
import yaml

from policies.slots.base import SlotPool
from router.app import RunningGateway, start_gateway
from router.config import DEFAULT_CONFIG_PATH, config_from_dict
from router.upstream.simulated.app import RunningSim
from router.upstream.simulated.engine import SimEngine, SimRecord

PRIMARY = "llama-70b"  # the route, and its primary backend
KEY = "sk-bench-batch-0123456789"  # the one key, with --auth


@dataclass(frozen=True)
class Engine70B:
    """The 70B's settings in config.yaml, and what follows from them."""

    slots: int
    ttft_s: float
    tokens_per_s: float
    shortest: int  # the answer lengths the engine draws: output_tokens +/- spread
    longest: int

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Engine70B:
        backend = raw["backends"][PRIMARY]
        sim = backend["simulated"]
        mean, spread = int(sim["output_tokens"]), float(sim.get("output_tokens_spread", 0))
        return cls(int(backend["slots"]), float(sim["ttft_s"]), float(sim["tokens_per_s"]),
                   max(1, round(mean * (1 - spread))), round(mean * (1 + spread)))

    @property
    def mean_hold_s(self) -> float:
        """A request's slot time: its first token, then one token per 1/tokens_per_s."""
        mean_tokens = (self.shortest + self.longest) / 2
        return self.ttft_s + (mean_tokens - 1) / self.tokens_per_s

    @property
    def capacity_per_s(self) -> float:
        return self.slots / self.mean_hold_s

    def length(self, rng: random.Random) -> int:
        return rng.randint(self.shortest, self.longest)


def default_raw() -> dict[str, Any]:
    raw: dict[str, Any] = yaml.safe_load(DEFAULT_CONFIG_PATH.read_text())
    return raw


def bench_config(folder: Path, name: str, auth: bool) -> dict[str, Any]:
    """config.yaml with its ledger (and so its files) under `folder`; with `auth`, one
    key. The 70B answers exactly `max_tokens` tokens (the client draws them)."""
    raw = default_raw()
    engine = Engine70B.of(raw)
    raw["ledger"] = {**raw.get("ledger", {}), "path": str(folder / f"{name}.sqlite3")}
    sim = raw["backends"][PRIMARY]["simulated"]
    sim["output_tokens"], sim["output_tokens_spread"] = engine.longest, 0
    if auth:
        digest = hashlib.sha256(KEY.encode()).hexdigest()
        raw["auth"] = {"enabled": True,
                       "keys": [{"id": "bench", "tenant": "bench", "sha256": digest}]}
    return raw


class KeptRecords(dict[str, SimRecord]):
    """The engine's records by request id, each also kept in `all`: a batch line run again
    after its slot was taken back comes with the same id, and the engine keeps the last."""

    def __init__(self, existing: dict[str, SimRecord]) -> None:
        super().__init__(existing)
        self.all: list[SimRecord] = list(existing.values())

    def __setitem__(self, key: str, value: SimRecord) -> None:
        super().__setitem__(key, value)
        self.all.append(value)


@dataclass
class BenchGateway:
    name: str
    running: RunningGateway
    ledger: Path
    auth: bool

    @classmethod
    async def start(cls, folder: Path, name: str, auth: bool,
                    edit: Callable[[dict[str, Any]], None] | None = None) -> BenchGateway:
        """`edit`: changes to the bench's config before the gateway is made of it."""
        raw = bench_config(folder, name, auth)
        if edit is not None:
            edit(raw)
        running = await start_gateway(config_from_dict(raw), "127.0.0.1", 0)
        gw = cls(name, running, Path(raw["ledger"]["path"]), auth)
        gw.engine.records = KeptRecords(gw.engine.records)
        return gw

    @property
    def url(self) -> str:
        return self.running.url

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {KEY}"} if self.auth else {}

    @property
    def pool(self) -> SlotPool:
        return self.running.gateway.backends[PRIMARY].pool

    @property
    def sim(self) -> RunningSim:
        sim = self.running.gateway.backends[PRIMARY].first().simulator
        assert sim is not None, "config.yaml's 70B is simulated"
        return sim

    @property
    def engine(self) -> SimEngine:
        return self.sim.engine

    def records(self) -> list[SimRecord]:
        kept = self.engine.records
        assert isinstance(kept, KeptRecords)
        return kept.all

    def preempted(self) -> int:
        return self.running.gateway.batch_lines.preempted

    async def close(self) -> None:
        await self.running.close()


PROMPTS = ("Summarise the attached meeting notes in five bullet points.",
           "Classify this support ticket as billing, bug or feature request.",
           "Write a Python function that parses ISO 8601 durations, with tests.",
           "Translate the product description into German.",
           "Explain step by step why the quarterly numbers do not add up.")


def batch_input(lines: int, engine: Engine70B, seed: int) -> bytes:
    """A batch of chat completions on the 70B's route, lengths drawn as the traffic's."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        body = {"model": PRIMARY, "max_tokens": engine.length(rng),
                "messages": [{"role": "user", "content": rng.choice(PROMPTS)}]}
        out.append(orjson.dumps({"custom_id": f"line-{i}", "method": "POST",
                                 "url": "/v1/chat/completions", "body": body}))
    return b"\n".join(out) + b"\n"


async def submit_batch(gw: BenchGateway, content: bytes) -> str:
    """Upload the input and create the job with the official SDK; the job's id."""
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEY if gw.auth else "none")
    try:
        made = await client.files.create(file=("input.jsonl", content), purpose="batch")
        job = await client.batches.create(input_file_id=made.id,
                                          endpoint="/v1/chat/completions",
                                          completion_window="24h")
        return job.id
    finally:
        await client.close()
