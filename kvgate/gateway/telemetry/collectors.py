"""Labelled histograms and counters written exactly as ``prometheus_client`` writes them, recorded
without its lock.

``prometheus_client.Histogram`` and ``Counter`` take a lock on every ``observe`` and ``inc``. kvgate
records on its one event-loop thread, so these collectors need none: an observation is one
``bisect`` and two additions, an increment one addition, and a stream's inter-token gaps are counted
per bin in one call (``observe_many``, ``kvgate.gateway.telemetry.sliding_windows.bin_counts``). A scrape from
another thread copies each count list first (one atomic copy under the GIL). ``labels`` creates a
child per label set once; the recorder keeps the child, so the hot path never builds a label dict.
The text exposition is the library's, sample for sample (``_bucket`` per upper bound and ``+Inf``,
``_count``, ``_sum``; ``_total``; ``_created``): tests compare the two.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from kvgate.gateway.telemetry.sliding_windows import bin_counts


class Buckets:
    """One label set of a histogram: a count per bucket (the last is ``+Inf``), the sum, creation."""

    __slots__ = ("bounds", "counts", "created_s", "labels", "sum")

    def __init__(self, labels: dict[str, str], bounds: tuple[float, ...]) -> None:
        self.labels = labels
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.created_s = time.time()

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_many(self, values: Sequence[float]) -> None:
        counts = self.counts
        for b, n in bin_counts(self.bounds, values):
            counts[b] += n
        self.sum += sum(values)


class BucketHistogram(Collector):
    """A labelled histogram, exposed as ``prometheus_client.Histogram`` exposes one."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._bounds = tuple(buckets)
        self._bound_labels = (*(repr(float(b)) for b in self._bounds), "+Inf")
        self._children: dict[tuple[str, ...], Buckets] = {}
        registry.register(self)

    def labels(self, *values: str) -> Buckets:
        child = self._children.get(values)
        if child is None:
            labels = dict(zip(self._labelnames, values, strict=True))
            child = self._children[values] = Buckets(labels, self._bounds)
        return child

    def describe(self) -> Iterable[Metric]:
        return [Metric(self._name, self._documentation, "histogram")]

    def collect(self) -> Iterable[Metric]:
        histogram = Metric(self._name, self._documentation, "histogram")
        created = Metric(self._name + "_created", self._documentation, "gauge")
        for child in list(self._children.values()):
            counts = list(child.counts)
            total = 0
            for le, n in zip(self._bound_labels, counts, strict=True):
                total += n
                histogram.add_sample(self._name + "_bucket", {**child.labels, "le": le}, float(total))
            histogram.add_sample(self._name + "_count", child.labels, float(total))
            histogram.add_sample(self._name + "_sum", child.labels, child.sum)
            created.add_sample(self._name + "_created", child.labels, child.created_s)
        return [histogram, created]


class Count:
    """One label set of a counter: its value (a float, as ``prometheus_client`` keeps it) and creation."""

    __slots__ = ("created_s", "labels", "value")

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.value = 0.0
        self.created_s = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class Counter(Collector):
    """A labelled counter, exposed as ``prometheus_client.Counter`` exposes one (``name`` without
    its ``_total``)."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Count] = {}
        registry.register(self)

    def labels(self, *values: str) -> Count:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = Count(dict(zip(self._labelnames, values, strict=True)))
        return child

    def remove(self, *values: str) -> None:
        self._children.pop(values, None)

    def describe(self) -> Iterable[Metric]:
        return [Metric(self._name, self._documentation, "counter")]

    def collect(self) -> Iterable[Metric]:
        counter = Metric(self._name, self._documentation, "counter")
        for child in list(self._children.values()):
            counter.add_sample(self._name + "_total", child.labels, child.value)
            counter.add_sample(self._name + "_created", child.labels, child.created_s)
        return [counter]
