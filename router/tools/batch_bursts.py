"""A batch job and bursts of interactive requests at one gateway, for `slotgate demo
--batch`: the batch fills the primary's idle slots and gives one back the moment an
interactive request would wait.

The batch goes in through the Files and Batches APIs; the bursts are `slotgate demo`'s
streams (hard prompts, which the classifier keeps on the primary). The primary's state is
read from the gateway's /metrics a few times a second. Prints nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from router.tools.demo import HARD, DemoResult, Row, run_demo

SAMPLE_S = 0.25  # how often /metrics is read
FILL_WITHIN_S = 15.0  # the batch must have taken every slot of a backend by then
OPEN = frozenset({"validating", "in_progress", "finalizing"})
_TOPICS = ("a support ticket", "a product review", "a meeting's notes", "a bug report")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass(frozen=True, slots=True)
class BatchPlan:
    model: str = "llama-70b"  # the route both the batch and the bursts ask for
    lines: int = 200  # requests in the batch
    seconds: float = 40.0  # from the batch's creation to the end of the last burst's start
    every_s: float = 8.0  # from one burst's start to the next
    burst: int | None = None  # interactive requests per burst (None: twice the slots)
    max_tokens: int = 40  # of an interactive answer
    line_tokens: int = 16  # of a batch line's answer


@dataclass(frozen=True, slots=True)
class Sample:
    """The primary's state in one scrape of /metrics."""

    at: float  # seconds since the batch was created
    capacity: int
    active: int  # slots held, batch lines included
    batch: int  # slots held by batch lines
    queued: int  # interactive requests waiting for a slot
    done: int  # batch lines answered (done or failed)
    preempted: int  # batch lines that gave their slot back, in all

    @property
    def interactive(self) -> int:
        return max(0, self.active - self.batch)

    @property
    def idle(self) -> int:
        return max(0, self.capacity - self.active)


@dataclass(slots=True)
class BatchDemo:
    plan: BatchPlan
    primary: str = ""
    samples: list[Sample] = field(default_factory=list)
    bursts: list[DemoResult] = field(default_factory=list)
    job: dict[str, Any] = field(default_factory=dict)  # the batch as last retrieved

    def rows(self) -> list[Row]:
        return [row for burst in self.bursts for row in burst.rows]


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _sample(samples: Samples, backend: str, at: float) -> Sample:
    def count(name: str, **labels: str) -> int:
        return round(_value(samples, name, backend=backend, **labels))

    lines = "slotgate_batch_lines_total"
    return Sample(at, count("slotgate_slot_capacity"), count("llm_active_slots_gauge"),
                  count("slotgate_batch_lines_running"), count("llm_queue_depth_gauge"),
                  count(lines, outcome="done") + count(lines, outcome="failed"),
                  count("slotgate_batch_preemptions_total"))


def _filled(samples: Samples) -> str | None:
    """A backend whose every slot a batch line holds: the batch's primary."""
    for (name, labels), running in samples.items():
        if name == "slotgate_batch_lines_running" and running > 0:
            backend = dict(labels)["backend"]
            if running >= _value(samples, "slotgate_slot_capacity", backend=backend):
                return backend
    return None


class GatewayClient:
    """The gateway as the demo's client sees it: its Batches API and its /metrics."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http = http
        self.base = url.rstrip("/").removesuffix("/v1")

    async def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        async with self.http.request(method, self.base + path, **kwargs) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{method} {path}: {resp.status} {body[:300]!r}")
        answer: dict[str, Any] = orjson.loads(body)
        return answer

    async def submit(self, plan: BatchPlan) -> dict[str, Any]:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", batch_input(plan), filename="demo-batch.jsonl",
                       content_type="application/jsonl")
        made = await self._json("POST", "/v1/files", data=form)
        return await self._json("POST", "/v1/batches", json={
            "input_file_id": made["id"], "endpoint": "/v1/chat/completions",
            "completion_window": "24h", "metadata": {"source": "slotgate demo --batch"}})

    async def job(self, batch_id: str) -> dict[str, Any]:
        return await self._json("GET", f"/v1/batches/{batch_id}")

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        return await self._json("POST", f"/v1/batches/{batch_id}/cancel")

    async def scrape(self) -> Samples:
        async with self.http.get(self.base + "/metrics") as resp:
            text = await resp.text()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


def batch_input(plan: BatchPlan) -> bytes:
    """The batch's JSONL: one short summary per line."""
    return b"".join(orjson.dumps({
        "custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": plan.model, "max_tokens": plan.line_tokens, "messages": [
            {"role": "user", "content": f"Summarise {_TOPICS[i % len(_TOPICS)]} (#{i}) "
                                        "in one sentence."}]}}) + b"\n"
        for i in range(1, plan.lines + 1))


class Run:
    """One run: the batch created, the primary watched, the bursts sent on schedule."""

    def __init__(self, gateway: GatewayClient, url: str, plan: BatchPlan,
                 on_second: Callable[[Sample, BatchDemo], None] | None) -> None:
        self.gateway, self.url, self.on_second = gateway, url, on_second
        self.result = BatchDemo(plan)
        self.filled = asyncio.Event()
        self.started = asyncio.get_running_loop().time()  # the batch was just created

    def now(self) -> float:
        return asyncio.get_running_loop().time() - self.started

    async def watch(self, stop: asyncio.Event) -> None:
        """Scrape /metrics every SAMPLE_S until `stop`; tell `on_second` once a second."""
        told = 0
        while True:
            samples = await self.gateway.scrape()
            if not self.filled.is_set() and (primary := _filled(samples)) is not None:
                self.result.primary = primary
                self.filled.set()
            if self.result.primary:
                sample = _sample(samples, self.result.primary, self.now())
                self.result.samples.append(sample)
                if self.on_second is not None and sample.at >= told:
                    told = math.floor(sample.at) + 1
                    self.on_second(sample, self.result)
            if stop.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SAMPLE_S)  # a period, and the end

    async def bursts(self) -> None:
        """From the moment the batch holds every slot, a burst every `every_s` until
        `seconds`; then every request sent is followed to its end."""
        plan = self.result.plan
        async with asyncio.timeout(FILL_WITHIN_S):
            await self.filled.wait()
        capacity = self.result.samples[-1].capacity if self.result.samples else 1
        size = plan.burst or 2 * capacity
        sent: list[asyncio.Task[DemoResult]] = []
        at = self.now()
        while at < plan.seconds:
            await asyncio.sleep(at - self.now())  # the schedule, not a synchronisation
            number = len(self.result.bursts) + 1
            burst = DemoResult(plan.model, [
                Row(f"burst{number}-{i}", "hard", HARD[i % len(HARD)]) for i in range(size)])
            self.result.bursts.append(burst)
            sent.append(asyncio.create_task(run_demo(self.url, burst, plan.max_tokens)))
            at += plan.every_s
        await asyncio.sleep(max(0.0, plan.seconds - self.now()))
        await asyncio.gather(*sent)


async def run_batch_demo(url: str, plan: BatchPlan,
                         on_second: Callable[[Sample, BatchDemo], None] | None = None
                         ) -> BatchDemo:
    """Create the batch, send the bursts, and cancel what is left of the batch at the end."""
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        gateway = GatewayClient(http, url)
        job = await gateway.submit(plan)
        run = Run(gateway, url, plan, on_second)
        stop = asyncio.Event()
        watching = asyncio.create_task(run.watch(stop))
        try:
            await run.bursts()
        finally:
            stop.set()
            await watching
            run.result.job = await gateway.job(job["id"])
            if run.result.job["status"] in OPEN:  # the rest would run on: not in a demo
                await gateway.cancel(job["id"])
    return run.result
