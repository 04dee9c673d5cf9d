"""The batch lines' and jobs' Prometheus series, read at scrape time from the runner's and
the preemption registry's own counts (nothing is updated per interactive request, and a
scrape queries no database: the jobs and waiting lines are as the runner's last turn read
them). Every configured backend's series, and every job status's, read 0 from the start."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.batch.preempt import RunningLines
from router.batch.runner import BatchRunner

OUTCOMES = ("done", "failed", "requeued")  # what became of a line's run (the runner's)
# A job's states, as OpenAI names them (router.batch.jobs).
STATUSES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired",
            "cancelling", "cancelled")
Label = TypeVar("Label", str, tuple[str, str])


class BatchCollector(Collector):
    def __init__(self, runner: BatchRunner, lines: RunningLines) -> None:
        self.runner = runner
        self.lines = lines

    def collect(self) -> Iterator[Metric]:
        configured = {pool.name for pool in self.runner.pools()}
        ended = CounterMetricFamily(
            "slotgate_batch_lines", "Batch lines by what became of a run: done, failed "
            "(an error answer, in the error file) or requeued (its slot taken back, or none "
            "free after all: it runs again)", labels=["backend", "outcome"])
        outcomes = self.runner.outcomes
        for backend, outcome in _union(((b, o) for b in configured for o in OUTCOMES),
                                       outcomes):
            ended.add_metric([backend, outcome], outcomes.get((backend, outcome), 0))
        yield ended
        preempted = CounterMetricFamily(
            "slotgate_batch_preemptions", "Batch lines that gave their slot to an "
            "interactive request", labels=["backend"])
        by_pool = self.lines.preempted_by_pool
        for backend in _union(configured, by_pool):
            preempted.add_metric([backend], by_pool.get(backend, 0))
        yield preempted
        running = GaugeMetricFamily("slotgate_batch_lines_running",
                                    "Batch lines holding a slot now", labels=["backend"])
        for backend in _union(configured, self.lines.pools()):
            running.add_metric([backend], self.lines.count(backend))
        yield running
        waiting = GaugeMetricFamily(
            "slotgate_batch_lines_waiting", "Batch lines of open jobs waiting to run, by "
            "their route's primary (as the batch runner last read them)", labels=["backend"])
        for backend in _union(configured, self.runner.waiting):
            waiting.add_metric([backend], self.runner.waiting.get(backend, 0))
        yield waiting
        jobs = GaugeMetricFamily(
            "slotgate_batch_jobs", "Batch jobs in the ledger's database by status (as the "
            "batch runner last read them)", labels=["status"])
        statuses = self.runner.statuses
        for status in (*STATUSES, *sorted(set(statuses) - set(STATUSES))):
            jobs.add_metric([status], statuses.get(status, 0))
        yield jobs


def _union(configured: Iterable[Label], seen: Iterable[Label]) -> list[Label]:
    """The configured labels and those counted (a backend since removed keeps its count),
    sorted."""
    found = set(configured)
    found.update(seen)
    return sorted(found)
