"""kvgate's Prometheus metrics and the windowed ``/signals`` aggregates, behind one object.

``GatewayMetrics`` owns its own ``CollectorRegistry`` (never the process-global one, so tests can
build many). Per-request events go through ``observe_*`` / ``count_*`` methods: each is one call on
the hot path, touches a cached labelled child and the matching ``SignalsWindow`` slot, and never
allocates a new label set after the first request of a pool and model. The latency histograms and
the counters are kvgate's lock-free collectors (``gateway/collectors.py``); a stream's inter-token
gaps arrive in one call at its end and are binned in one pass. ``record_response`` carries everything a
finished response reports (TTFT, duration, gaps, tokens) in one call with one clock read. Work
gauges (tokens queued, pending, resident, KV occupancy, replica readiness) are not pushed: a
collector asks the gateway's ``PoolWorkSource`` at scrape time, so they are always current and drop
to zero when the gateway is idle. Names follow Prometheus conventions: ``kvgate_<thing>_<unit>``,
base units, ``_total`` counters; labels are ``pool`` and ``model``, ``replica`` only on per-replica
gauges, and ``reason`` only from the decision cores' bounded sets.

The completion routes' outcomes are counted where each is known, one call per event: every answer
by ``code`` and ``reason`` (``count_relayed`` for the replica's own status, ``count_error`` for one
the gateway decided, its reason the decision's or its error class's), each failed attempt on a
replica by ``kind`` (``count_upstream_error``), each retry decision (``count_retry``) and each
ejection (``observe_health``). Replicas are labelled by their name (``ReplicaState.name``), never
their URL; a replica's series are declared at zero by its first health outcome, so an alert sees
the first failure, and go when it leaves the fleet. ``kvgate_build_info`` and the standard
``process_*`` / ``python_*`` collectors are on the same registry.
"""

from __future__ import annotations

import importlib.metadata
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from admission.coordination import CoordinationStatus
from gateway.collectors import BucketHistogram, Buckets, Count, Counter
from gateway.errors import GatewayError, ModelNotFound
from gateway.pool_work import PoolWork, PoolWorkSource
from gateway.replica_http import ReplicaConnectError, ReplicaDisconnected, ReplicaHTTPError
from gateway.signals_window import Clock, SignalsWindow
from gateway.sliding_windows import CountWindow, LatencyWindow, ServedWindow
from gateway.state import ReplicaState

TTFT_BUCKETS_S = (
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
)
ITL_BUCKETS_S = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
QUEUE_WAIT_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
E2E_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)
TOKENIZER_RATIO_BUCKETS = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 1.0, 1.02, 1.05, 1.1, 1.2, 1.5, 2.0)

# Names of every series kvgate exports (histograms without their _bucket/_sum/_count suffixes).
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
HISTOGRAMS = (
    "kvgate_time_to_first_token_seconds",
    "kvgate_inter_token_latency_seconds",
    "kvgate_queue_wait_seconds",
    "kvgate_request_duration_seconds",
    "kvgate_tokenizer_estimate_ratio",
)
COUNTERS = (
    "kvgate_admission_decisions_total",
    "kvgate_prompt_tokens_total",
    "kvgate_output_tokens_total",
    "kvgate_responses_total",
    "kvgate_upstream_errors_total",
    "kvgate_retries_total",
    "kvgate_replica_ejections_total",
    "kvgate_reservations_expired_total",
)
INFO_GAUGES = ("kvgate_build_info",)
UPSTREAM_ERROR_KINDS = ("connect", "timeout", "disconnected", "protocol", "status_5xx", "status_429", "other")
"""How an attempt on a replica failed: no connection, a connect/first-byte/idle timeout, the
connection closed mid-response, an answer that was not HTTP/1.1, a 5xx or 429 answer, anything else."""
RETRY_OUTCOMES = ("retry", "no_replica", "max_retries", "retry_budget")
"""What became of a request whose replica failed before the first byte: retried on another replica,
no other replica could take it, or refused by ``routing.max_retries`` or the retry budget."""
RELAYED = "replica"
"""The ``reason`` of an answer whose status the replica chose (a success or its own 4xx)."""
_REASON_OF_STATUS = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    429: "upstream_saturated",
    500: "internal",
    502: "upstream_error",
    503: "upstream_unavailable",
    504: "upstream_timeout",
}
"""The reason of a gateway error that carries none: an admission error always does, so a reasonless
429 or 503 is a replica's own answer passed on."""
COORDINATION_SERIES = (
    "kvgate_coordination_up",
    "kvgate_coordination_last_sync_age_seconds",
    "kvgate_coordination_errors_total",
)
"""Exported only when Redis coordination is configured (``bind_coordination``)."""
COORDINATION_ERROR_KINDS = ("connection", "authentication", "timeout", "response", "bad_value", "internal")


class _WorkCollector(Collector):
    """Reads the gateway's state at scrape time and emits the work and readiness gauges."""

    def __init__(self, owner: GatewayMetrics) -> None:
        self._owner = owner

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        work = list(self._owner.pool_work())
        yield from _work_families(work)
        yield from self._owner._desired_families()


def _work_families(work: list[PoolWork]) -> Iterator[Metric]:
    pm = ["pool", "model"]
    per_model = {
        "queued_requests": GaugeMetricFamily(
            "kvgate_queued_requests", "Requests waiting in kvgate's admission queue.", labels=pm
        ),
        "queued_prompt_tokens": GaugeMetricFamily(
            "kvgate_queued_prompt_tokens",
            "Prompt tokens of requests waiting in kvgate's admission queue.",
            labels=pm,
        ),
        "pending_prompt_tokens": GaugeMetricFamily(
            "kvgate_pending_prompt_tokens",
            "Prompt tokens of admitted requests that have not produced a first token.",
            labels=pm,
        ),
        "resident_sequences": GaugeMetricFamily(
            "kvgate_resident_sequences", "Admitted sequences not yet finished (decode work).", labels=pm
        ),
        "remaining_decode_tokens": GaugeMetricFamily(
            "kvgate_remaining_decode_tokens",
            "Output tokens still to come for resident sequences, bounded by each request's max output.",
            labels=pm,
        ),
    }
    prefill = GaugeMetricFamily(
        "kvgate_prefill_work_tokens",
        "Prefill work: prompt tokens queued in kvgate plus admitted without a first token.",
        labels=pm,
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
        labels=["pool", "replica"],
    )
    warming = GaugeMetricFamily(
        "kvgate_replica_warming",
        "1 while a ready replica is inside its warm-up ramp.",
        labels=["pool", "replica"],
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


class _CoordinationCollector(Collector):
    """The coordination gauges, read from the coordinator at scrape time so they never lag."""

    def __init__(self, status: Callable[[], CoordinationStatus]) -> None:
        self._status = status

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        status = self._status()
        up = GaugeMetricFamily(
            "kvgate_coordination_up",
            "1 while the gateway sees the other gateways' loads through Redis (last sync good and "
            "within the lease), 0 otherwise.",
            value=1.0 if status.up else 0.0,
        )
        age = GaugeMetricFamily(
            "kvgate_coordination_last_sync_age_seconds",
            "Seconds since the gateway's last good sync with Redis (absent before the first).",
        )
        if status.last_sync_age_s is not None:
            age.add_metric([], status.last_sync_age_s)
        return [up, age]


@dataclass(frozen=True, slots=True)
class _Series:
    """Every labelled child and window one (pool, model) pair's events touch, looked up once."""

    ttft: Buckets
    itl: Buckets
    queue_wait: Buckets
    e2e: Buckets
    prompt_tokens: Count
    output_tokens: Count
    ttft_window: LatencyWindow
    itl_window: LatencyWindow
    queue_wait_window: LatencyWindow
    e2e_window: LatencyWindow
    served: ServedWindow


@dataclass(frozen=True, slots=True)
class _Decisions:
    """One (pool, model, decision, reason)'s counter and its pool's ``/signals`` decision window."""

    count: Count
    window: CountWindow


@dataclass(frozen=True, slots=True)
class _ReplicaSeries:
    """One replica's ejection counter and its upstream error counter per kind."""

    labels: tuple[str, str]
    ejections: Count
    errors: dict[str, Count]


def _reason_of(error: GatewayError) -> str:
    if error.reason is not None:
        return error.reason
    if isinstance(error, ModelNotFound):
        return "model_not_found"
    return _REASON_OF_STATUS.get(error.status, "internal")


def upstream_error_kind(exc: BaseException) -> str:
    """One of ``UPSTREAM_ERROR_KINDS`` for a failed attempt: a replica client error, or the gateway
    error a replica's 5xx/429 answer became (``errors.upstream_status_error``)."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, ReplicaConnectError):
        return "connect"
    if isinstance(exc, ReplicaDisconnected):
        return "disconnected"
    if isinstance(exc, ReplicaHTTPError):
        return "protocol"
    if isinstance(exc, GatewayError) and exc.status >= 500:
        return "status_5xx"
    if isinstance(exc, GatewayError) and exc.status == 429:
        return "status_429"
    return "other"


class _BuildInfo(Collector):
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


class _NoWork:
    def pool_work(self) -> Iterable[PoolWork]:
        return ()


class GatewayMetrics:
    """Every metric kvgate exports, plus the ``/signals`` window fed by the same calls.

    ``work_source`` may be bound later (``bind``) when the gateway state is built after the
    metrics. ``clock`` is monotonic seconds; ``window_s`` is the ``/signals`` window."""

    def __init__(
        self,
        work_source: PoolWorkSource | None = None,
        *,
        clock: Clock = time.monotonic,
        window_s: float = 60.0,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.signals = SignalsWindow(clock, window_s=window_s)
        self._source: PoolWorkSource = work_source or _NoWork()
        pm = ["pool", "model"]
        r = self.registry
        self._ttft = BucketHistogram(
            "kvgate_time_to_first_token_seconds",
            "Seconds from the request reaching kvgate to its first output token reaching the client.",
            pm,
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self._itl = BucketHistogram(
            "kvgate_inter_token_latency_seconds",
            "Seconds between consecutive output tokens of a streamed response.",
            pm,
            buckets=ITL_BUCKETS_S,
            registry=r,
        )
        self._queue_wait = BucketHistogram(
            "kvgate_queue_wait_seconds",
            "Seconds a request waited in kvgate's admission queue before it was admitted or dropped.",
            pm,
            buckets=QUEUE_WAIT_BUCKETS_S,
            registry=r,
        )
        self._e2e = BucketHistogram(
            "kvgate_request_duration_seconds",
            "Seconds from the request reaching kvgate to its last byte reaching the client.",
            pm,
            buckets=E2E_BUCKETS_S,
            registry=r,
        )
        self._tokenizer_ratio = BucketHistogram(
            "kvgate_tokenizer_estimate_ratio",
            "kvgate's prompt token estimate divided by the replica's reported prompt tokens.",
            ["model"],
            buckets=TOKENIZER_RATIO_BUCKETS,
            registry=r,
        )
        self._decisions = Counter(
            "kvgate_admission_decisions",
            "Admission decisions by outcome (admit, queue, reject) and reason.",
            ["pool", "model", "decision", "reason"],
            registry=r,
        )
        self._prompt_tokens = Counter(
            "kvgate_prompt_tokens", "Prompt tokens of requests served (replica's count).", pm, registry=r
        )
        self._output_tokens = Counter(
            "kvgate_output_tokens", "Output tokens streamed back to clients.", pm, registry=r
        )
        self._expired = Counter(
            "kvgate_reservations_expired",
            "Reservations released because their lease ran out: their request never released them "
            "(a gateway bug, or a request stuck past its lease); any increase deserves an alert.",
            ["pool"],
            registry=r,
        )
        self._coordination_errors = Counter(
            "kvgate_coordination_errors",
            "Redis coordination failures by kind: connection, authentication, timeout, response (a "
            "Redis error reply), bad_value (an entry of another gateway skipped as unreadable), internal.",
            ["kind"],
            registry=r,
        )
        self._responses = Counter(
            "kvgate_responses",
            "Answers of the completion routes by HTTP code and reason: `replica` when the status is "
            "the replica's, else why the gateway answered so (an admission reason, invalid_request, "
            "unauthorized, model_not_found, payload_too_large, upstream_error, upstream_timeout, ...).",
            ["code", "reason"],
            registry=r,
        )
        self._upstream_errors = Counter(
            "kvgate_upstream_errors",
            "Failed attempts on a replica by kind: " + ", ".join(UPSTREAM_ERROR_KINDS) + ".",
            ["pool", "replica", "kind"],
            registry=r,
        )
        self._retries = Counter(
            "kvgate_retries",
            "What became of requests whose replica failed before the first byte: retry (sent to "
            "another replica), no_replica, or refused by max_retries or the retry budget.",
            ["pool", "outcome"],
            registry=r,
        )
        self._ejections = Counter(
            "kvgate_replica_ejections",
            "Times a replica was ejected from routing by passive or active health checks.",
            ["pool", "replica"],
            registry=r,
        )
        r.register(_BuildInfo())
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self._relayed: dict[int, Count] = {}
        self._refused: dict[tuple[type[GatewayError], str | None], Count] = {}
        self._replicas: dict[str, _ReplicaSeries] = {}
        self._coordination_collector: _CoordinationCollector | None = None
        self._decided: dict[tuple[str, str, str, str], _Decisions] = {}
        self._series: dict[tuple[str, str], _Series] = {}
        self._clock = clock
        r.register(_WorkCollector(self))

    def bind(self, work_source: PoolWorkSource) -> None:
        self._source = work_source

    def pool_work(self) -> Iterable[PoolWork]:
        return self._source.pool_work()

    def _decisions_for(self, pool: str, model: str, decision: str, reason: str) -> _Decisions:
        key = (pool, model, decision, reason)
        decided = self._decided.get(key)
        if decided is None:
            decided = self._decided[key] = _Decisions(
                self._decisions.labels(*key), self.signals.decision_window(pool, decision)
            )
        return decided

    def _admitted_for(self, pool: str, model: str, reason: str) -> _Decisions:
        """The first admission of a pool and model also creates its series, so its histograms and
        token counters are exported (at zero) from then on."""
        if (pool, model) not in self._series:
            self._series_for(pool, model)
        return self._decisions_for(pool, model, "admit", reason)

    def _series_for(self, pool: str, model: str) -> _Series:
        series = self._series.get((pool, model))
        if series is None:
            windows = self.signals.pool_windows(pool)
            series = self._series[(pool, model)] = _Series(
                ttft=self._ttft.labels(pool, model),
                itl=self._itl.labels(pool, model),
                queue_wait=self._queue_wait.labels(pool, model),
                e2e=self._e2e.labels(pool, model),
                prompt_tokens=self._prompt_tokens.labels(pool, model),
                output_tokens=self._output_tokens.labels(pool, model),
                ttft_window=windows.ttft,
                itl_window=windows.itl,
                queue_wait_window=windows.queue_wait,
                e2e_window=windows.e2e,
                served=windows.served,
            )
        return series

    def observe_ttft(self, pool: str, model: str, seconds: float) -> None:
        series = self._series.get((pool, model)) or self._series_for(pool, model)
        series.ttft.observe(seconds)
        series.ttft_window.observe(seconds, self._clock())

    def observe_queue_wait(self, pool: str, model: str, seconds: float) -> None:
        series = self._series.get((pool, model)) or self._series_for(pool, model)
        series.queue_wait.observe(seconds)
        series.queue_wait_window.observe(seconds, self._clock())

    def record_response(
        self,
        pool: str,
        model: str,
        ttft_s: float | None,
        e2e_s: float,
        itl_gaps_s: Sequence[float] = (),
        prompt_tokens: int | None = None,
        output_tokens: int = 0,
        estimated_prompt_tokens: int | None = None,
    ) -> None:
        """What one answered request measured, in one call at its end: time to first token (None
        when nothing came), duration, every inter-token gap of a stream, and the replica's token
        counts (None when it reported none) beside kvgate's prompt estimate."""
        series = self._series.get((pool, model)) or self._series_for(pool, model)
        now_s = self._clock()
        if ttft_s is not None:
            series.ttft.observe(ttft_s)
            series.ttft_window.observe(ttft_s, now_s)
        series.e2e.observe(e2e_s)
        series.e2e_window.observe(e2e_s, now_s)
        if itl_gaps_s:
            series.itl.observe_many(itl_gaps_s)
            series.itl_window.observe_many(itl_gaps_s, now_s)
        if prompt_tokens is None:
            return
        series.prompt_tokens.inc(prompt_tokens)
        series.output_tokens.inc(output_tokens)
        series.served.add(prompt_tokens, output_tokens, now_s)
        if estimated_prompt_tokens is not None and prompt_tokens > 0:
            self._tokenizer_ratio.labels(model).observe(estimated_prompt_tokens / prompt_tokens)

    def count_admitted(self, pool: str, model: str, reason: str, queue_wait_s: float | None) -> None:
        """One admission, with its queue wait (None: not observed here)."""
        decided = self._decided.get((pool, model, "admit", reason)) or self._admitted_for(pool, model, reason)
        decided.count.value += 1
        now_s = self._clock()
        decided.window.add(1, now_s)
        if queue_wait_s is not None:
            series = self._series.get((pool, model)) or self._series_for(pool, model)
            series.queue_wait.observe(queue_wait_s)
            series.queue_wait_window.observe(queue_wait_s, now_s)

    def count_decision(self, decision: str, reason: str, *, pool: str = "", model: str = "") -> None:
        """One admission outcome; ``pool``/``model`` empty when the request never reached a pool
        (e.g. a 400 for an unknown model)."""
        decided = self._decided.get((pool, model, decision, reason)) or self._decisions_for(
            pool, model, decision, reason
        )
        decided.count.value += 1
        decided.window.add(1, self._clock())

    def count_expired(self, pool: str, reservations: int = 1) -> None:
        """Reservations of ``pool`` released by their lease; 0 declares the series (so alerts see a
        zero before the first one)."""
        self._expired.labels(pool).inc(reservations)

    def declare_pool(self, pool: str) -> None:
        """Export the pool's expired reservations and retry outcomes at zero, so alerts on their
        increase see the first one."""
        self._expired.labels(pool)
        for outcome in RETRY_OUTCOMES:
            self._retries.labels(pool, outcome)

    def count_relayed(self, status: int) -> None:
        """An answer whose status the replica chose reached the client (its headers did)."""
        count = self._relayed.get(status)
        if count is None:
            count = self._relayed[status] = self._responses.labels(str(status), RELAYED)
        count.value += 1

    def count_error(self, error: GatewayError) -> None:
        """The gateway answered ``error`` on a completion route."""
        key = (type(error), error.reason)
        count = self._refused.get(key)
        if count is None:
            count = self._refused[key] = self._responses.labels(str(error.status), _reason_of(error))
        count.value += 1

    def _replica_series(self, replica: ReplicaState) -> _ReplicaSeries:
        series = self._replicas.get(replica.replica_id)
        if series is None:
            labels = (replica.pool, replica.name)
            series = self._replicas[replica.replica_id] = _ReplicaSeries(
                labels,
                self._ejections.labels(*labels),
                {kind: self._upstream_errors.labels(*labels, kind) for kind in UPSTREAM_ERROR_KINDS},
            )
        return series

    def count_upstream_error(self, replica: ReplicaState, exc: BaseException) -> None:
        """An attempt on ``replica`` failed with ``exc`` (before or after the first byte)."""
        self._replica_series(replica).errors[upstream_error_kind(exc)].value += 1

    def observe_health(self, replica: ReplicaState, *, ejected: bool) -> None:
        """A health outcome of ``replica`` was taken in; ``ejected`` when it ejected the replica.
        The first declares the replica's series at zero."""
        series = self._replicas.get(replica.replica_id) or self._replica_series(replica)
        if ejected:
            series.ejections.value += 1

    def count_retry(self, pool: str, outcome: str) -> None:
        """``outcome`` is one of ``RETRY_OUTCOMES``."""
        self._retries.labels(pool, outcome).value += 1

    def forget_replica(self, replica_id: str) -> None:
        """The replica left the fleet: its series go (a fleet that churns pods keeps no stale ones)."""
        series = self._replicas.pop(replica_id, None)
        if series is not None:
            self._ejections.remove(*series.labels)
            for kind in UPSTREAM_ERROR_KINDS:
                self._upstream_errors.remove(*series.labels, kind)

    def bind_coordination(self, status: Callable[[], CoordinationStatus]) -> None:
        """Export the coordination gauges, asking ``status`` at every scrape; the error kinds start at 0."""
        if self._coordination_collector is None:
            self._coordination_collector = _CoordinationCollector(status)
            self.registry.register(self._coordination_collector)
            for kind in COORDINATION_ERROR_KINDS:
                self._coordination_errors.labels(kind)

    def count_coordination_errors(self, kind: str, count: int = 1) -> None:
        """``kind`` is one of ``COORDINATION_ERROR_KINDS``."""
        self._coordination_errors.labels(kind).inc(count)

    def set_desired_replicas(self, pool: str, replicas: int, reason: str) -> None:
        self.signals.set_desired(pool, replicas, reason)

    def _desired_families(self) -> Iterator[Metric]:
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
        for pool, d in sorted(self.signals.desired().items()):
            desired.add_metric([pool], float(d.replicas))
            info.add_metric([pool, d.reason], 1.0)
        yield desired
        yield info

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    def signals_doc(self) -> dict[str, Any]:
        """The ``/signals`` document for the current instant."""
        return self.signals.snapshot(self.pool_work())
