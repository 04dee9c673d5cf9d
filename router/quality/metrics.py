"""The shadow comparisons' Prometheus series, read at scrape time from the runner's own
counts (nothing is updated per request). Every outcome and verdict reads 0 from the start."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.quality.shadows import ShadowRunner

# What became of a sampled request: kept for a comparison, cut (an interactive request
# took its slot: it waits again), failed (a call failed), replay_failed (the primary
# answered an error: nothing to compare), or skipped before it was kept.
OUTCOMES = ("kept", "cut", "failed", "replay_failed", "skipped:opted_out",
            "skipped:pending_full", "skipped:tokens_per_hour", "skipped:tenant_tokens_per_hour",
            "skipped:waited_too_long")
VERDICTS = ("better", "tie", "worse", "none")  # the small model's answer; none: unreadable


class ShadowCollector(Collector):
    def __init__(self, runner: ShadowRunner) -> None:
        self.runner = runner

    def collect(self) -> Iterator[Metric]:
        counts = self.runner.counts
        shadows = CounterMetricFamily(
            "slotgate_shadows", "Downgraded requests sampled for a shadow comparison, by what "
            "became of them", labels=["outcome"])
        for outcome in OUTCOMES:
            shadows.add_metric([outcome], counts.get(outcome, 0))
        yield shadows
        verdicts = CounterMetricFamily(
            "slotgate_shadow_verdicts", "The judge's verdicts on the small model's answer "
            "against the primary's (none: its replies could not be read)", labels=["verdict"])
        for verdict in VERDICTS:
            verdicts.add_metric([verdict], counts.get("verdict:" + verdict, 0))
        yield verdicts
        yield GaugeMetricFamily("slotgate_shadows_waiting", "Shadow comparisons waiting for "
                                "an idle slot", value=len(self.runner.pending))
        yield GaugeMetricFamily("slotgate_shadow_tokens_hour", "Tokens spent on shadow "
                                "replays and judgements this hour, in all",
                                value=self.runner.tokens.spent(None))
