"""Counters and histograms that every request updates, summed in plain Python and turned
into Prometheus families only when scraped.

A prometheus_client child takes a lock on every update, and a request makes five of
them: about 4% of its CPU at thousands of requests per second. Here an update is a dict
lookup and an addition. Every update and every scrape runs on the event loop's thread,
so nothing needs a lock. The exposition is the same text: `_total` for counters and
`_bucket`/`_count`/`_sum` for histograms, without prometheus_client's `_created` series.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

Labels = tuple[str, ...]


class Tally(Collector):
    """A counter family: `add(labels, amount)`, or `cell(labels)` once and then `cell[0] +=
    amount` (router/telemetry/served.py: no label tuple hashed per update)."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.cells: dict[Labels, list[float]] = {}  # each series' value, in a cell of its own

    @property
    def values(self) -> dict[Labels, float]:
        return {labels: cell[0] for labels, cell in self.cells.items()}

    def add(self, labels: Labels, amount: float = 1.0) -> None:
        cells = self.cells  # (`in` and `[]`: no call of their own, as `get` is)
        if labels in cells:
            cells[labels][0] += amount
        else:
            cells[labels] = [amount]

    def cell(self, labels: Labels) -> list[float]:
        """The series' cell (made at 0): add to its item 0."""
        cells = self.cells
        if labels in cells:
            return cells[labels]
        found = cells[labels] = [0.0]
        return found

    def zero(self, labels: Labels) -> None:
        """The series at 0 unless it exists (router/telemetry/zeros.py)."""
        self.cells.setdefault(labels, [0.0])

    def drop(self, stale: Callable[[Labels], bool]) -> None:
        self.cells = {k: v for k, v in self.cells.items() if not stale(k)}

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for labels, cell in self.cells.items():
            family.add_metric(list(labels), cell[0])
        yield family


class Spread(Collector):
    """A histogram family: `series(labels)` once, then `observe(series, value)`."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str],
                 buckets: Sequence[float]) -> None:
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.bounds = tuple(buckets)
        self._series: dict[Labels, list[float]] = {}

    def series(self, labels: Labels) -> list[float]:
        """The counts per bucket (the last one +Inf), then the sum: observe into it."""
        if labels in self._series:  # (no `get` call)
            return self._series[labels]
        found = self._series[labels] = [0.0] * (len(self.bounds) + 2)
        return found

    def zero(self, labels: Labels) -> None:
        """The series at 0 unless it exists (router/telemetry/zeros.py)."""
        self.series(labels)

    def drop(self, stale: Callable[[Labels], bool]) -> None:
        self._series = {k: v for k, v in self._series.items() if not stale(k)}

    def observe(self, series: list[float], value: float) -> None:
        series[bisect_left(self.bounds, value)] += 1  # the first bucket with le >= value
        series[-1] += value

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        edges = [*(repr(float(b)) for b in self.bounds), "+Inf"]  # le="0.01", le="1.0"
        for labels, series in self._series.items():
            family.add_metric(list(labels), list(zip(edges, accumulate(series[:-1]),
                                                     strict=True)), sum_value=series[-1])
        yield family
