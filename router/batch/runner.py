"""The batch runner: each gateway process runs the lines of the jobs in its ledger's
database through its own endpoint (loopback HTTP, with a per-process secret that stands
for the job's key), so a line is checked, routed, limited, metered and written to the
ledger as a live request of that key is. A line starts only when its route's primary has a
free slot and nobody waits for it, at the lowest class (`sheddable`); an interactive
request that finds the slots taken by batch lines waits behind them (taking a slot back
from a running line is the next step of #32).

The answers are kept per line in the database; a job's output and error files are
written when its last line ends. Lines a stopped gateway was running run again at its
next start: nothing of theirs was written.
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

from policies.slots.base import SlotPool
from router.batch.files import Files
from router.batch.jobs import Job, Jobs

log = logging.getLogger("slotgate.batch")
SECRET_HEADER = "x-slotgate-batch-key"  # the job's key id, with the process's secret
EXPIRY_CHECK_S = 60.0  # how often a job's window is checked with nothing else happening
LINE_TIMEOUT_S = 3600.0  # one line, queue and answer (a backend's own bounds come first)


class BatchRunner:
    def __init__(self, jobs: Jobs, url: str, secret: str,
                 primary: Callable[[str], SlotPool | None],
                 pools: Callable[[], Iterable[SlotPool]], holding: Callable[[str], int]
                 ) -> None:
        """`primary`: the pool of a model's route's primary; `pools`: every pool;
        `holding`: how many batch lines hold a slot of a pool (router.batch.preempt)."""
        self.primary = primary
        self.pools = pools
        self.holding = holding
        self.sent: dict[str, set[asyncio.Task[None]]] = {}  # lines in flight, by pool
        self.outcomes: Counter[tuple[str, str]] = Counter()  # (pool, done|failed|requeued)
        self.jobs = jobs
        self.url = url
        self.secret = secret
        self.running: dict[str, set[asyncio.Task[None]]] = {}  # by job
        self.wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._unwatch: list[Any] = []

    async def start(self) -> None:
        await self.jobs.store.run("UPDATE batch_lines SET state = 'waiting' "
                                  "WHERE state = 'running'")  # cut by a stop: again
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
            try:
                await asyncio.wait(waits, timeout=EXPIRY_CHECK_S,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()

    async def _turn(self) -> bool:
        """Advance every open job; whether any is open."""
        rows = await self.jobs.store.run("SELECT id FROM batches WHERE status IN "
                                         "('in_progress', 'cancelling') ORDER BY created_at")
        for (job_id,) in rows:
            job = await self.jobs.get(None, str(job_id))
            await self._advance(job)
        return bool(rows) or any(self.running.values())

    async def _advance(self, job: Job) -> None:
        running = self.running.setdefault(job.id, set())
        waiting = job.counts.get("waiting", 0)
        ending = _ending(job)
        if ending is not None:  # its waiting lines end unrun; running ones finish
            await self.jobs.store.run("UPDATE batch_lines SET state = ? WHERE batch_id = ? "
                                      "AND state = 'waiting'", (ending, job.id))
            waiting = 0
        if not running and not waiting and not job.counts.get("running", 0):
            await self._finish(job)
            return
        while waiting and self._room(job):
            claimed = await self._claim(job)
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

    def _room(self, job: Job) -> bool:
        """A free slot on the route's primary, and nobody waiting for one there."""
        pool = self.primary(job.model)
        if pool is None or pool.queued:
            return False
        # lines sent that hold no slot yet will take one: they count as taken
        coming = len(self.sent.get(pool.name, ())) - self.holding(pool.name)
        return pool.active + max(0, coming) < pool.capacity

    async def _claim(self, job: Job) -> tuple[int, str, str] | None:
        rows = await self.jobs.store.run(
            "SELECT line, custom_id, body FROM batch_lines WHERE batch_id = ? AND "
            "state = 'waiting' ORDER BY line LIMIT 1", (job.id,))
        if not rows:
            return None
        line, custom_id, body = rows[0]
        await self.jobs.store.run("UPDATE batch_lines SET state = 'running' WHERE "
                                  "batch_id = ? AND line = ?", (job.id, line))
        return int(line), str(custom_id), str(body)  # type: ignore[call-overload]

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
        except aiohttp.ServerDisconnectedError:  # its slot went to an interactive request
            status, answer = 503, b""
        except (aiohttp.ClientError, TimeoutError) as exc:
            status, answer = 502, orjson.dumps({"error": {
                "message": f"The line could not be run: {type(exc).__name__}",
                "type": "server_error", "param": None, "code": "batch_line_failed"}})
        pool = self.primary(job.model)
        if status in (429, 503):  # preempted, no slot after all, or draining: again
            await self.jobs.store.run("UPDATE batch_lines SET state = 'waiting' WHERE "
                                      "batch_id = ? AND line = ?", (job.id, line))
            self.outcomes[pool.name if pool else "", "requeued"] += 1
        else:
            self.outcomes[pool.name if pool else "", "done" if status < 400 else "failed"] += 1
            result = {"id": "batch_req_" + os.urandom(12).hex(), "custom_id": custom_id,
                      "response": {"status_code": status, "request_id": request_id,
                                   "body": _json(answer)}, "error": None}
            await self.jobs.store.run(
                "UPDATE batch_lines SET state = ?, status_code = ?, answer = ? WHERE "
                "batch_id = ? AND line = ?", ("done" if status < 400 else "failed", status,
                                              orjson.dumps(result).decode(), job.id, line))
        self.wake.set()

    async def _finish(self, job: Job) -> None:
        """Write the output and error files, in the input's order, and close the job."""
        rows = await self.jobs.store.run("SELECT state, answer FROM batch_lines WHERE "
                                         "batch_id = ? AND answer IS NOT NULL ORDER BY line",
                                         (job.id,))
        output = [str(answer) for state, answer in rows if state == "done"]
        errors = [str(answer) for state, answer in rows if state == "failed"]
        files = self.jobs.files
        out_id = await _keep(files, job, output, "output") if output else None
        err_id = await _keep(files, job, errors, "errors") if errors else None
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
