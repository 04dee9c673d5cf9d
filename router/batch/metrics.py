"""The batch lines' Prometheus series, read at scrape time from the runner's and the
preemption registry's own counts (nothing is updated per interactive request)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.batch.preempt import RunningLines
from router.batch.runner import BatchRunner


class BatchCollector(Collector):
    def __init__(self, runner: BatchRunner, lines: RunningLines) -> None:
        self.runner = runner
        self.lines = lines

    def collect(self) -> Iterator[Metric]:
        ended = CounterMetricFamily(
            "slotgate_batch_lines", "Batch lines by what became of a run: done, failed "
            "(an error answer, in the error file) or requeued (its slot taken back, or none "
            "free after all: it runs again)", labels=["backend", "outcome"])
        for (backend, outcome), n in sorted(self.runner.outcomes.items()):
            ended.add_metric([backend, outcome], n)
        yield ended
        preempted = CounterMetricFamily(
            "slotgate_batch_preemptions", "Batch lines that gave their slot to an "
            "interactive request", labels=["backend"])
        for backend, n in sorted(self.lines.preempted_by_pool.items()):
            preempted.add_metric([backend], n)
        yield preempted
        running = GaugeMetricFamily("slotgate_batch_lines_running",
                                    "Batch lines holding a slot now", labels=["backend"])
        for backend in sorted(self.lines.pools()):
            running.add_metric([backend], self.lines.count(backend))
        yield running
