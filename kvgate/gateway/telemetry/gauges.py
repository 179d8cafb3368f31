"""The gauges ``/metrics`` reads off the gateway's state at scrape time instead of recording them.

Work (tokens queued, pending and resident, KV occupancy, replica readiness), the autoscaling
policy's last answer and the coordination status are states, not events: a collector asks for them
when Prometheus scrapes, so they are always current and drop to zero when the gateway is idle, and
nothing is written on the request path to keep them. Each collector is given the callable it reads
(``PoolWorkSource.pool_work``, ``SignalsWindow.desired``, the coordinator's status); none holds a
copy. The series recorded per event are in ``kvgate/gateway/telemetry/event_series.py``.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import platform
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from kvgate.admission.coordination_gate import CoordinationStatus
from kvgate.admission.promises import PromiseCounts
from kvgate.gateway.telemetry.pool_work import PoolWork
from kvgate.gateway.telemetry.signals_doc import Desired

WORK_GAUGES = (
    "kvgate_queued_requests",
    "kvgate_queued_prompt_tokens",
    "kvgate_pending_prompt_tokens",
    "kvgate_prefill_work_tokens",
    "kvgate_resident_sequences",
    "kvgate_remaining_decode_tokens",
    "kvgate_replica_kv_occupancy_ratio",
    "kvgate_pool_kv_occupancy_ratio",
    "kvgate_replica_ready",
    "kvgate_replica_warming",
    "kvgate_pool_replicas",
    "kvgate_autoscaler_desired_replicas",
    "kvgate_autoscaler_decision_info",
)
"""Every gauge ``WorkGauges`` writes."""
FORECAST_GAUGES = ("kvgate_autoscaler_forecast_replicas", "kvgate_autoscaler_forecast_error_replicas")
"""Exported for a pool only once its policy's forecast has history (``forecast.enabled``)."""
INFO_GAUGES = ("kvgate_build_info",)
COORDINATION_SERIES = (
    "kvgate_coordination_up",
    "kvgate_coordination_last_sync_age_seconds",
    "kvgate_coordination_errors_total",
    "kvgate_coordination_gateways",
    "kvgate_coordination_claim_kv_tokens",
    "kvgate_coordination_claim_sequences",
)
"""Exported only when Redis coordination is configured (``bind_coordination``)."""
ITL_GUARD_GAUGES = ("kvgate_itl_guard_sequences",)
"""Exported only when a model has an ITL objective (``bind_itl_guard``)."""
PROMISE_OUTCOMES = ("made", "kept", "broken", "lapsed")
"""What became of a promised slot (``kvgate.admission.promises.PromiseCounts``)."""


class WorkGauges(Collector):
    """The work gauges of every pool and the policy's last answer, as the gateway reports them now."""

    def __init__(
        self, work: Callable[[], Iterable[PoolWork]], desired: Callable[[], Mapping[str, Desired]]
    ) -> None:
        self._work = work
        self._desired = desired

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        yield from _work_families(list(self._work()))
        yield from _desired_families(self._desired())


def _work_families(work: list[PoolWork]) -> Iterator[Metric]:
    pool_model = ["pool", "model"]
    pool_replica = ["pool", "replica"]
    per_model = {
        "queued_requests": GaugeMetricFamily(
            "kvgate_queued_requests", "Requests waiting in kvgate's admission queue.", labels=pool_model
        ),
        "queued_prompt_tokens": GaugeMetricFamily(
            "kvgate_queued_prompt_tokens",
            "Prompt tokens of requests waiting in kvgate's admission queue.",
            labels=pool_model,
        ),
        "pending_prompt_tokens": GaugeMetricFamily(
            "kvgate_pending_prompt_tokens",
            "Prompt tokens of admitted requests that have not produced a first token.",
            labels=pool_model,
        ),
        "resident_sequences": GaugeMetricFamily(
            "kvgate_resident_sequences",
            "Admitted sequences not yet finished (decode work).",
            labels=pool_model,
        ),
        "remaining_decode_tokens": GaugeMetricFamily(
            "kvgate_remaining_decode_tokens",
            "Output tokens still to come for resident sequences, bounded by each request's max output.",
            labels=pool_model,
        ),
    }
    prefill = GaugeMetricFamily(
        "kvgate_prefill_work_tokens",
        "Prefill work: prompt tokens queued in kvgate plus admitted without a first token.",
        labels=pool_model,
    )
    replica_occ = GaugeMetricFamily(
        "kvgate_replica_kv_occupancy_ratio",
        "KV cache occupancy of one replica, 0..1: kvgate's estimate and the replica's scraped value.",
        labels=["pool", "replica", "source"],
    )
    pool_occ = GaugeMetricFamily(
        "kvgate_pool_kv_occupancy_ratio",
        "Capacity-weighted KV cache occupancy of a pool, 0..1, by source (estimate or scraped).",
        labels=["pool", "source"],
    )
    ready = GaugeMetricFamily(
        "kvgate_replica_ready",
        "1 when the replica passes health checks and takes traffic.",
        labels=pool_replica,
    )
    warming = GaugeMetricFamily(
        "kvgate_replica_warming",
        "1 while a ready replica is inside its warm-up ramp.",
        labels=pool_replica,
    )
    replicas = GaugeMetricFamily(
        "kvgate_pool_replicas",
        "Replicas of a pool by state (known, ready, warming).",
        labels=["pool", "state"],
    )
    for pw in work:
        for mw in pw.models:
            for name, family in per_model.items():
                family.add_metric([pw.pool, mw.model], float(getattr(mw, name)))
            prefill.add_metric([pw.pool, mw.model], float(mw.queued_prompt_tokens + mw.pending_prompt_tokens))
        for rw in pw.replicas:
            replica_occ.add_metric([pw.pool, rw.replica, "estimate"], rw.kv_occupancy_estimate_ratio)
            if rw.kv_occupancy_scraped_ratio is not None:
                replica_occ.add_metric([pw.pool, rw.replica, "scraped"], rw.kv_occupancy_scraped_ratio)
            ready.add_metric([pw.pool, rw.replica], 1.0 if rw.ready else 0.0)
            warming.add_metric([pw.pool, rw.replica], 1.0 if rw.ready and rw.warming else 0.0)
        pool_occ.add_metric([pw.pool, "estimate"], pw.kv_occupancy_estimate_ratio)
        scraped = pw.kv_occupancy_scraped_ratio
        if scraped is not None:
            pool_occ.add_metric([pw.pool, "scraped"], scraped)
        replicas.add_metric([pw.pool, "known"], float(len(pw.replicas)))
        replicas.add_metric([pw.pool, "ready"], float(sum(1 for r in pw.replicas if r.ready)))
        replicas.add_metric([pw.pool, "warming"], float(sum(1 for r in pw.replicas if r.ready and r.warming)))
    yield from per_model.values()
    yield from (prefill, replica_occ, pool_occ, ready, warming, replicas)


def _desired_families(answers: Mapping[str, Desired]) -> Iterator[Metric]:
    desired = GaugeMetricFamily(
        "kvgate_autoscaler_desired_replicas",
        "Replicas the autoscaling policy recommends for a pool.",
        labels=["pool"],
    )
    info = GaugeMetricFamily(
        "kvgate_autoscaler_decision_info",
        "1 for the reason of the policy's last recommendation for a pool.",
        labels=["pool", "reason"],
    )
    forecast = GaugeMetricFamily(
        "kvgate_autoscaler_forecast_replicas",
        "Demand the autoscaling policy's forecast expects over its lead, in replicas.",
        labels=["pool"],
    )
    error = GaugeMetricFamily(
        "kvgate_autoscaler_forecast_error_replicas",
        "The latest forecast whose lead has passed minus the most demand that came over it, in replicas.",
        labels=["pool"],
    )
    for pool, answer in sorted(answers.items()):
        desired.add_metric([pool], float(answer.replicas))
        info.add_metric([pool, answer.reason], 1.0)
        if answer.forecast_replicas is not None:
            forecast.add_metric([pool], answer.forecast_replicas)
        if answer.forecast_error_replicas is not None:
            error.add_metric([pool], answer.forecast_error_replicas)
    yield desired
    yield info
    yield forecast
    yield error


class CoordinationGauges(Collector):
    """The coordination gauges, read from the coordinator at scrape time so they never lag."""

    def __init__(self, status: Callable[[], CoordinationStatus]) -> None:
        self._status = status

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        status = self._status()
        up = GaugeMetricFamily(
            "kvgate_coordination_up",
            "1 while the gateway sees the other gateways' claims through Redis (last sync good and "
            "within the lease), 0 otherwise.",
            value=1.0 if status.up else 0.0,
        )
        age = GaugeMetricFamily(
            "kvgate_coordination_last_sync_age_seconds",
            "Seconds since the gateway's last good sync with Redis (absent before the first).",
        )
        if status.last_sync_age_s is not None:
            age.add_metric([], status.last_sync_age_s)
        gateways = GaugeMetricFamily(
            "kvgate_coordination_gateways",
            "Live gateways sharing the fleet, this one included, as its last sync saw them.",
            value=float(status.gateways),
        )
        kv = GaugeMetricFamily(
            "kvgate_coordination_claim_kv_tokens",
            "KV tokens of a replica this gateway may admit into: its claim, granted through Redis.",
            labels=["replica"],
        )
        sequences = GaugeMetricFamily(
            "kvgate_coordination_claim_sequences",
            "Sequence slots of a replica this gateway may admit into: its claim, granted through Redis.",
            labels=["replica"],
        )
        for replica, kv_tokens, slots in status.claims:
            kv.add_metric([replica], float(kv_tokens))
            sequences.add_metric([replica], float(slots))
        return [up, age, gateways, kv, sequences]


class PromiseCounters(Collector):
    """``kvgate_promises_total``: the admission controller's promise counts, read at scrape time."""

    def __init__(self, counts: Callable[[], PromiseCounts]) -> None:
        self._counts = counts

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        counts = self._counts()
        family = CounterMetricFamily(
            "kvgate_promises",
            "Slots promised to refused requests at their Retry-After, by outcome: made (booked), kept "
            "(the request came back in its window and was admitted or queued first), broken (it came "
            "back in its window and was refused all the same), lapsed (it did not come back in time).",
            labels=["outcome"],
        )
        for outcome in PROMISE_OUTCOMES:
            family.add_metric([outcome], float(getattr(counts, outcome)))
        errors = counts.errors
        histogram = HistogramMetricFamily(
            "kvgate_promise_forecast_error_seconds",
            "When a promise's room was there less the time promised (negative: the room waited for "
            "the client; positive: the client came back before its room), observed when it is kept, "
            "broken, or lapses with its room held.",
        )
        cumulative = list(itertools.accumulate(errors.counts))
        bounds = [f"{bound:g}" for bound in errors.bounds_s] + ["+Inf"]
        buckets = [(bound, float(n)) for bound, n in zip(bounds, cumulative, strict=True)]
        histogram.add_metric([], buckets, errors.sum_s)
        return [family, histogram]


class ItlGuardGauges(Collector):
    """``kvgate_itl_guard_sequences``: each replica's learned sequence limit, read at scrape time."""

    def __init__(self, limits: Callable[[], Iterable[tuple[str, str, int]]]) -> None:
        self._limits = limits
        """(pool, replica name, limit) of every replica the guard has learned about."""

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "kvgate_itl_guard_sequences",
            "Most sequences a replica may run while its predicted inter-token latency meets the "
            "model's objective, learned from its streams (max_active_sequences_per_replica until "
            "enough streams were seen).",
            labels=["pool", "replica"],
        )
        for pool, replica, sequences in sorted(self._limits()):
            family.add_metric([pool, replica], float(sequences))
        return [family]


class PrefixCacheSources(Collector):
    """``kvgate_prefix_cache_replicas``: how many replicas of each pool routing reads from their own
    KV events, and how many from what kvgate routed there, read at scrape time."""

    def __init__(self, sources: Callable[[], Iterable[tuple[str, str]]]) -> None:
        self._sources = sources
        """(pool, source) of every replica: source ``events`` or ``routed``."""

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "kvgate_prefix_cache_replicas",
            "Replicas whose prefix cache routing reads from their own KV events (source=events: what "
            "they hold, evictions included) or from what kvgate sent them (source=routed: a guess).",
            labels=["pool", "source"],
        )
        counts: dict[tuple[str, str], int] = {}
        for pool, source in self._sources():
            counts[(pool, source)] = counts.get((pool, source), 0) + 1
        for (pool, source), replicas in sorted(counts.items()):
            family.add_metric([pool, source], float(replicas))
        return [family]


class BuildInfo(Collector):
    """``kvgate_build_info``: the installed package's version (from its metadata) and Python's."""

    def __init__(self) -> None:
        try:
            self.version = importlib.metadata.version("kvgate")
        except importlib.metadata.PackageNotFoundError:
            self.version = "unknown"

    def collect(self) -> Iterable[Metric]:
        info = GaugeMetricFamily(
            "kvgate_build_info",
            "1, labelled with the installed kvgate version and the Python running it.",
            labels=["version", "python"],
        )
        info.add_metric([self.version, platform.python_version()], 1.0)
        return [info]
