"""The batch runner: each gateway process runs the lines of the jobs in its ledger's
database through its own endpoint (loopback HTTP, with a per-process secret that stands
for the job's key), so a line is checked, routed, limited, metered and written to the
ledger as a live request of that key is. A line starts only when its route's primary has a
free slot, nobody waits for it and the backend's batch lines hold less than their
`batch.max_share` of its slots. A line never waits in an interactive line: one that finds
no free slot after all is refused and waits again in its job, and an interactive request
that would wait where batch lines hold slots takes one back (`router.batch.preempt`).

Lines are claimed in the database (`router.batch.claims`), so several gateways drain one
job and none runs a line another holds. The answers are kept per line; a job's output and
error files are written when its last line ends. Lines a stopped gateway was running run
again (at once after a clean stop, once their claims lapse after a kill): nothing of
theirs was written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp
import orjson
from aiohttp import hdrs

from policies.config.batch import BatchConfig
from policies.slots.base import SlotPool
from router.batch.claims import Claims
from router.batch.files import Files
from router.batch.jobs import Job, Jobs
from router.batch.results import written

log = logging.getLogger("slotgate.batch")
SECRET_HEADER = "x-slotgate-batch-key"  # the job's key id, with the process's secret
LINE_TIMEOUT_S = 3600.0  # one line, queue and answer (a backend's own bounds come first)
# A line refused for want of a slot (taken between the runner's look and the line's
# arrival) or cut for an interactive request runs again as soon as a slot frees. Any other
# refusal (its key's budget or rate, a drain, a backend out of service) pauses its job for
# the Retry-After the gateway gave, within these bounds.
SLOT_RACE = frozenset({None, "queue_full"})  # x-slotgate-reject-reason (None: cut)
PAUSE_S = (1.0, 300.0)


class BatchRunner:
    def __init__(self, jobs: Jobs, url: str, secret: str,
                 config: Callable[[], BatchConfig], primary: Callable[[str], SlotPool | None],
                 pools: Callable[[], Iterable[SlotPool]], holding: Callable[[str], int]
                 ) -> None:
        """`primary`: the pool of a model's route's primary; `pools`: every pool;
        `holding`: how many batch lines hold a slot of a pool (router.batch.preempt);
        `config`: the `batch` section as it is now (a reload may change it)."""
        self.config = config
        self.claims = Claims(jobs.store, config().line_lease_s)
        self.elsewhere: Counter[str] = Counter()  # by pool: lines other processes run
        self.renewed_at = self.recounted_at = 0.0
        self.paused: dict[str, float] = {}  # job id -> no line of it starts before (monotonic)
        self.primary = primary
        self.pools = pools
        self.holding = holding
        self.sent: dict[str, set[asyncio.Task[None]]] = {}  # lines in flight, by pool
        self.outcomes: Counter[tuple[str, str]] = Counter()  # (pool, done|failed|requeued)
        # As the last turn read them, for the metrics (router.batch.metrics): lines waiting
        # by their route's primary ("" for a model no route serves), jobs by status.
        self.waiting: dict[str, int] = {}
        self.statuses: dict[str, int] = {}
        self.jobs = jobs
        self.url = url
        self.secret = secret
        self.running: dict[str, set[asyncio.Task[None]]] = {}  # by job
        self.wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._unwatch: list[Any] = []

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(
            total=LINE_TIMEOUT_S))
        self._task = asyncio.create_task(self._loop(), name="batch-runner")

    def _watch(self, on: bool) -> None:
        """Be woken by the pools' changes (only while a job runs: an idle runner costs
        interactive requests nothing, not even a callback)."""
        if on and not self._unwatch:
            self._unwatch = [pool.watch(lambda _: self.wake.set())
                             for pool in self.pools()]
        elif not on:
            for unwatch in self._unwatch:
                unwatch()
            self._unwatch = []

    async def close(self) -> None:
        self._watch(False)
        tasks = [t for lines in self.running.values() for t in lines]
        if self._task is not None:
            tasks.append(self._task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for job_id in self.running:  # cut by the stop: they run again, here or elsewhere
            with contextlib.suppress(Exception):  # (a database gone: their claims lapse)
                await self.claims.give_back(job_id)
        if self._session is not None:
            await self._session.close()

    async def _loop(self) -> None:
        while True:
            self.wake.clear()
            self.jobs.changed.clear()
            active = True
            try:
                active = await self._turn()
            except Exception:  # a database blip: the next turn tries again
                log.exception("batch runner: a turn failed")
            self._watch(active)
            waits = [asyncio.ensure_future(self.jobs.changed.wait()),
                     asyncio.ensure_future(self.wake.wait())]
            # Jobs of other gateways, windows ending and claims to renew, with nothing
            # else happening
            every_s = min(self.config().poll_s, self.claims.lease_s / 3,
                          *(until - time.monotonic() for until in self.paused.values()))
            try:
                await asyncio.wait(waits, timeout=every_s,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()

    async def _turn(self) -> bool:
        """Advance every open job; whether any is open. The lines left waiting and the jobs
        by status are kept for the metrics, which a scrape reads without a query."""
        await self._renew()
        rows = await self.jobs.store.run("SELECT id FROM batches WHERE status IN "
                                         "('in_progress', 'cancelling') ORDER BY created_at")
        jobs = [await self.jobs.get(None, str(job_id)) for (job_id,) in rows]
        await self._recount(jobs)
        self.elsewhere.clear()
        for job in jobs:
            pool = self.primary(job.model)
            if pool is not None and job.counts.get("running", 0):
                self.elsewhere[pool.name] += await self.claims.held_elsewhere(job.id)
        waiting: Counter[str] = Counter()
        for job in jobs:
            pool = self.primary(job.model)
            waiting[pool.name if pool else ""] += await self._advance(job)
        self.waiting = dict(waiting)
        counted = await self.jobs.store.run("SELECT status, COUNT(*) FROM batches "
                                            "GROUP BY status")
        self.statuses = {str(status): int(n) for status, n in counted}  # type: ignore[call-overload]
        return bool(rows) or any(self.running.values())

    async def _recount(self, jobs: list[Job]) -> None:
        """Every poll, the shared counts of the pools the jobs run on: a pool whose slots
        a killed gateway held reads full here until someone asks Redis again."""
        now = time.monotonic()
        if now - self.recounted_at >= self.config().poll_s:
            self.recounted_at = now
            for pool in {pool.name: pool for job in jobs
                         if (pool := self.primary(job.model)) is not None}.values():
                await pool.recount()

    async def _renew(self) -> None:
        """Extend the claims of the lines this process runs, a third of a lease ahead."""
        now = time.monotonic()
        if now - self.renewed_at >= self.claims.lease_s / 3:
            self.renewed_at = now
            await self.claims.renew([job for job, lines in self.running.items() if lines])

    async def _advance(self, job: Job) -> int:
        """Start what lines of `job` have room, or end it; how many are left waiting."""
        running = self.running.setdefault(job.id, set())
        waiting = job.counts.get("waiting", 0)
        ending = _ending(job)
        if ending is not None:  # its waiting lines end unrun; running ones finish
            await self.claims.end_unrun(job.id, ending)
            waiting = 0
        if not running and not waiting and not job.counts.get("running", 0):
            await self._finish(job)
            return 0
        left = waiting
        if self.paused.get(job.id, 0.0) > time.monotonic():
            return left
        self.paused.pop(job.id, None)
        if ending is None:  # lines other processes run: their claims may lapse
            waiting += job.counts.get("running", 0) - len(running)
        while waiting > 0 and self._room(job):
            claimed = await self.claims.claim(job.id)
            if claimed is None:
                break
            waiting -= 1
            task = asyncio.create_task(self._line(job, *claimed))
            running.add(task)
            task.add_done_callback(running.discard)
            pool = self.primary(job.model)
            if pool is not None:
                sent = self.sent.setdefault(pool.name, set())
                sent.add(task)
                task.add_done_callback(sent.discard)
            left = max(0, left - 1)
        return left

    def _room(self, job: Job) -> bool:
        """A free slot on the route's primary, nobody waiting for one there, and the
        backend's batch lines (this process's and others') within their share."""
        pool = self.primary(job.model)
        if pool is None or pool.queued:
            return False
        sent = len(self.sent.get(pool.name, ()))
        if sent + self.elsewhere[pool.name] >= self.config().share_of(pool.name,
                                                                     pool.capacity):
            return False
        # lines sent that hold no slot yet will take one: they count as taken
        coming = sent - self.holding(pool.name)
        return pool.active + max(0, coming) < pool.capacity

    async def _line(self, job: Job, line: int, custom_id: str, body: str) -> None:
        assert self._session is not None
        request_id = f"{job.id}-{line}"
        headers = {"Authorization": f"Bearer {self.secret}", "Content-Type":
                   "application/json", "x-slotgate-priority": "sheddable",
                   "x-request-id": request_id, SECRET_HEADER: job.key_id or ""}
        try:
            async with self._session.post(self.url + job.endpoint, data=body.encode(),
                                          headers=headers) as resp:
                status, answer = resp.status, await resp.read()
                reason = resp.headers.get("x-slotgate-reject-reason")
                after = resp.headers.get(hdrs.RETRY_AFTER)
        except aiohttp.ServerDisconnectedError:  # its slot went to an interactive request
            status, answer, reason, after = 503, b"", None, None
        except (aiohttp.ClientError, TimeoutError) as exc:
            status, reason, after = 502, None, None
            answer = orjson.dumps({"error": {
                "message": f"The line could not be run: {type(exc).__name__}",
                "type": "server_error", "param": None, "code": "batch_line_failed"}})
        pool = self.primary(job.model)
        name = pool.name if pool else ""
        if status in (429, 503):  # cut, refused: again (after a pause, unless for a slot)
            await self.claims.give_back(job.id, line)
            self.outcomes[name, "requeued"] += 1
            if reason not in SLOT_RACE:
                self.paused[job.id] = time.monotonic() + _pause_s(after)
        else:
            result = {"id": "batch_req_" + os.urandom(12).hex(), "custom_id": custom_id,
                      "response": {"status_code": status, "request_id": request_id,
                                   "body": _json(answer)}, "error": None}
            state = "done" if status < 400 else "failed"
            if await self.claims.settle(job.id, line, state, status,
                                        orjson.dumps(result).decode()):
                self.outcomes[name, state] += 1
            else:  # its claim lapsed and another process took the line: its answer counts
                self.outcomes[name, "superseded"] += 1
        self.wake.set()

    async def _finish(self, job: Job) -> None:
        """Write the job's files (router.batch.results: every line, those that never ran
        too, in the input's order) and close it, unless another process is finishing it. A
        Message Batch's results file is kept as its output file."""
        self.paused.pop(job.id, None)
        if not await self.claims.finishing(job.id):
            self.running.pop(job.id, None)
            return
        rows = await self.jobs.store.run("SELECT custom_id, state, answer FROM batch_lines "
                                         "WHERE batch_id = ? ORDER BY line", (job.id,))
        kept: dict[str, str] = {}
        for kind, lines in written(job.endpoint, [
                (str(custom_id), str(state), None if answer is None else str(answer))
                for custom_id, state, answer in rows]).items():
            if lines:
                kept[kind] = await _keep(self.jobs.files, job, lines, kind)
        out_id, err_id = kept.get("output") or kept.get("results"), kept.get("errors")
        final = _ending(job) or "completed"
        now = time.time()
        await self.jobs.store.run(
            "UPDATE batches SET status = ?, output_file_id = ?, error_file_id = ?, "
            f"finalizing_at = ?, {final}_at = ? WHERE id = ?",
            (final, out_id, err_id, now, now, job.id))
        await self.jobs.store.run("UPDATE batch_lines SET answer = NULL, body = '' WHERE "
                                  "batch_id = ?", (job.id,))  # kept in the files now
        self.running.pop(job.id, None)


def _ending(job: Job) -> str | None:
    """How an open job ends early: cancelled (asked for), expired (past its window)."""
    if job.status == "cancelling":
        return "cancelled"
    return "expired" if time.time() >= job.expires_at else None


def _pause_s(retry_after: str | None) -> float:
    """How long a refused line's job waits: the gateway's Retry-After, within PAUSE_S."""
    try:
        wait_s = float(retry_after or 0)
    except ValueError:
        wait_s = 0.0
    return min(max(wait_s, PAUSE_S[0]), PAUSE_S[1])


def _json(answer: bytes) -> Any:
    with contextlib.suppress(orjson.JSONDecodeError):
        return orjson.loads(answer)
    return {"error": {"message": answer[:1000].decode(errors="replace"), "type":
                      "server_error", "param": None, "code": None}}


async def _keep(files: Files, job: Job, lines: list[str], kind: str) -> str:
    data = ("\n".join(lines) + "\n").encode()
    record = await files.keep(job.tenant, f"{job.id}_{kind}.jsonl", "batch_output", data,
                              len(lines))
    return record.id
