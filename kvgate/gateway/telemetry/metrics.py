"""The one recorder of what the gateway observes, and the two documents read from what it recorded:
``/metrics`` (Prometheus text) and ``/signals`` (JSON per pool, the autoscaler's input).

The decision path and the proxy report each event by one call (``count_admitted``,
``record_response``, ``count_error``, ...), and that call is the only place the event is recorded:
it adds to the labelled Prometheus child (lock-free ``kvgate/gateway/telemetry/collectors.py``, families in
``kvgate/gateway/telemetry/event_series.py``) and, where the autoscaler reads it, to the pool's sliding window
(``kvgate/gateway/telemetry/signals_doc.py``). The children and windows of a pool and model are looked up once
and kept (``_Series``), so after its first request no call allocates a label set;
``record_response`` carries all a finished response measured with one clock read. States (work,
readiness, the policy's last answer, coordination) are not recorded but read when a document is
asked for (``kvgate/gateway/telemetry/gauges.py``, ``SignalsWindow.snapshot``), so they are never stale.

Replicas are labelled by their name, never their URL; a replica's series are declared at zero by
its first health outcome, so an alert sees the first failure, and go when it leaves the fleet.
Each instance owns its ``CollectorRegistry`` (never the process-global one, so tests can build
many), with ``kvgate_build_info`` and the standard ``process_*`` / ``python_*`` collectors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import generate_latest

from kvgate.admission.coordination_gate import CoordinationStatus
from kvgate.admission.promises import PromiseCounts
from kvgate.gateway.edge.errors import GatewayError
from kvgate.gateway.state import ReplicaState
from kvgate.gateway.telemetry.collectors import Buckets, Count
from kvgate.gateway.telemetry.event_series import (
    COORDINATION_ERROR_KINDS,
    RELAYED,
    RETRY_OUTCOMES,
    UPSTREAM_ERROR_KINDS,
    EventSeries,
    response_reason,
    upstream_error_kind,
)
from kvgate.gateway.telemetry.gauges import (
    BuildInfo,
    CoordinationGauges,
    ItlGuardGauges,
    PrefixCacheSources,
    PromiseCounters,
    WorkGauges,
)
from kvgate.gateway.telemetry.objectives import Objectives, ObjectiveSeries
from kvgate.gateway.telemetry.pool_work import PoolWork, PoolWorkSource
from kvgate.gateway.telemetry.signals_doc import SignalsWindow
from kvgate.gateway.telemetry.sliding_windows import CountWindow, LatencyWindow, ServedWindow
from kvgate.vocabulary.clock import Clock


@dataclass(frozen=True, slots=True)
class _Series:
    """Every labelled child and window one (pool, model) pair's events touch, looked up once."""

    ttft: Buckets
    itl: Buckets
    queue_wait: Buckets
    e2e: Buckets
    prompt_tokens: Count
    output_tokens: Count
    forecast_error: Buckets
    wait_budget: Buckets
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


class GatewayMetrics:
    """Records every event once; ``render`` and ``signals_doc`` read what was recorded.

    ``work_source`` may be bound later (``bind``) when the gateway state is built after the
    metrics. ``clock`` is monotonic seconds; ``window_s`` is the ``/signals`` window."""

    def __init__(
        self,
        work_source: PoolWorkSource | None = None,
        *,
        clock: Clock = time.monotonic,
        window_s: float = 60.0,
        tenant_label: bool = False,
    ) -> None:
        self.registry = r = CollectorRegistry(auto_describe=False)
        self.signals = SignalsWindow(clock, window_s=window_s)
        self._source = work_source
        self._clock = clock
        self._events = EventSeries(r)
        self._loop_lag = self._events.loop_lag.labels()
        r.register(BuildInfo())
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        r.register(WorkGauges(self.pool_work, self.signals.desired))
        self._coordination_bound = False
        self._series: dict[tuple[str, str], _Series] = {}
        self._decided: dict[tuple[str, str, str, str], _Decisions] = {}
        self._tenant_label = tenant_label
        """Label answers with their tenant (``metrics.tenant_label``); else the tenant label is empty."""
        self._relayed: dict[str, dict[str, dict[str, dict[int, Count]]]] = {}
        """Model → route → tenant → status: nested so that counting an answer allocates nothing."""
        self._refused: dict[tuple[str, str, str, type[GatewayError], str | None], Count] = {}
        self._replicas: dict[str, _ReplicaSeries] = {}
        self._objectives: ObjectiveSeries | None = None

    def bind(self, work_source: PoolWorkSource) -> None:
        self._source = work_source

    def pool_work(self) -> Iterable[PoolWork]:
        return () if self._source is None else self._source.pool_work()

    def _decisions_for(self, pool: str, model: str, decision: str, reason: str) -> _Decisions:
        key = (pool, model, decision, reason)
        decided = self._decided.get(key)
        if decided is None:
            decided = self._decided[key] = _Decisions(
                self._events.decisions.labels(*key), self.signals.decision_window(pool, decision)
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
            events = self._events
            windows = self.signals.pool_windows(pool)
            series = self._series[(pool, model)] = _Series(
                ttft=events.ttft.labels(pool, model),
                itl=events.itl.labels(pool, model),
                queue_wait=events.queue_wait.labels(pool, model),
                e2e=events.e2e.labels(pool, model),
                prompt_tokens=events.prompt_tokens.labels(pool, model),
                output_tokens=events.output_tokens.labels(pool, model),
                forecast_error=events.forecast_error.labels(pool, model),
                wait_budget=events.wait_budget.labels(pool, model),
                ttft_window=windows.ttft,
                itl_window=windows.itl,
                queue_wait_window=windows.queue_wait,
                e2e_window=windows.e2e,
                served=windows.served,
            )
        return series

    def observe_loop_lag(self, seconds: float) -> None:
        self._loop_lag.observe(seconds)

    def observe_ttft(self, pool: str, model: str, seconds: float) -> None:
        series = self._series.get((pool, model)) or self._series_for(pool, model)
        series.ttft.observe(seconds)
        series.ttft_window.observe(seconds, self._clock())

    def observe_queue_wait(self, pool: str, model: str, seconds: float) -> None:
        series = self._series.get((pool, model)) or self._series_for(pool, model)
        series.queue_wait.observe(seconds)
        series.queue_wait_window.observe(seconds, self._clock())

    def observe_queue_forecast(
        self, pool: str, model: str, waited_s: float, predicted_s: float, budget_s: float
    ) -> None:
        """A request left the queue (dispatched or refused at its deadline): how far the predicted
        wait was off, and how much of the wait it could afford it used."""
        series = self._series.get((pool, model)) or self._series_for(pool, model)
        series.forecast_error.observe(waited_s - predicted_s)
        series.wait_budget.observe(min(1.0, waited_s / budget_s) if budget_s > 0 else 1.0)

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
            self._events.tokenizer_ratio.labels(model).observe(estimated_prompt_tokens / prompt_tokens)

    def record_prefill(
        self, pool: str, model: str, prompt_tokens: int, estimated_prompt_tokens: int | None
    ) -> None:
        """A disaggregated request's prompt, counted where it was prefilled (its prefill pool), so
        that pool's prompt tokens per second are its own; its output goes with ``record_response``
        on its decode pool."""
        series = self._series.get((pool, model)) or self._series_for(pool, model)
        series.prompt_tokens.inc(prompt_tokens)
        series.served.add(prompt_tokens, 0, self._clock())
        if estimated_prompt_tokens is not None and prompt_tokens > 0:
            self._events.tokenizer_ratio.labels(model).observe(estimated_prompt_tokens / prompt_tokens)

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
        self._events.expired.labels(pool).inc(reservations)

    def declare_pool(self, pool: str) -> None:
        """Export the pool's expired reservations and retry outcomes at zero, so alerts on their
        increase see the first one."""
        self._events.expired.labels(pool)
        for outcome in RETRY_OUTCOMES:
            self._events.retries.labels(pool, outcome)

    def count_relayed(self, status: int, model: str = "", route: str = "", tenant: str | None = None) -> None:
        """An answer whose status the replica chose reached the client (its headers did)."""
        tenant_value = (tenant or "") if self._tenant_label else ""
        try:
            count = self._relayed[model][route][tenant_value][status]
        except KeyError:
            count = self._events.responses.labels(str(status), RELAYED, model, route, tenant_value)
            by_route = self._relayed.setdefault(model, {}).setdefault(route, {})
            by_route.setdefault(tenant_value, {})[status] = count
        count.value += 1

    def count_error(
        self, error: GatewayError, model: str = "", route: str = "", tenant: str | None = None
    ) -> None:
        """The gateway answered ``error`` on a proxied route (``model`` empty when the request
        named none it serves)."""
        tenant_value = (tenant or "") if self._tenant_label else ""
        key = (model, route, tenant_value, type(error), error.reason)
        count = self._refused.get(key)
        if count is None:
            count = self._refused[key] = self._events.responses.labels(
                str(error.status), response_reason(error), model, route, tenant_value
            )
        count.value += 1

    def _replica_series(self, replica: ReplicaState) -> _ReplicaSeries:
        series = self._replicas.get(replica.replica_id)
        if series is None:
            labels = (replica.pool, replica.name)
            series = self._replicas[replica.replica_id] = _ReplicaSeries(
                labels,
                self._events.ejections.labels(*labels),
                {kind: self._events.upstream_errors.labels(*labels, kind) for kind in UPSTREAM_ERROR_KINDS},
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
        self._events.retries.labels(pool, outcome).value += 1

    def forget_replica(self, replica_id: str) -> None:
        """The replica left the fleet: its series go (a fleet that churns pods keeps no stale ones)."""
        series = self._replicas.pop(replica_id, None)
        if series is not None:
            self._events.ejections.remove(*series.labels)
            for kind in UPSTREAM_ERROR_KINDS:
                self._events.upstream_errors.remove(*series.labels, kind)

    def bind_promises(self, counts: Callable[[], PromiseCounts]) -> None:
        """Export ``kvgate_promises_total``, read from ``counts`` at every scrape."""
        self.registry.register(PromiseCounters(counts))

    def bind_objectives(self, objectives: Objectives) -> None:
        """Count streams against ``objectives`` (``count_objective``) and export them."""
        if self._objectives is None:
            self._objectives = ObjectiveSeries(self.registry, objectives)

    def count_objective(self, pool: str, model: str, objective: int, met: bool) -> None:
        """A stream met its latency objective or missed it (``objective`` 0: TTFT, 1: ITL)."""
        if self._objectives is not None:
            self._objectives.count(pool, model, objective, met)

    def bind_itl_guard(self, limits: Callable[[], Iterable[tuple[str, str, int]]]) -> None:
        """Export ``kvgate_itl_guard_sequences``, read from ``limits`` (pool, replica name, limit)
        at every scrape."""
        self.registry.register(ItlGuardGauges(limits))

    def bind_coordination(self, status: Callable[[], CoordinationStatus]) -> None:
        """Export the coordination gauges, asking ``status`` at every scrape; the error kinds start at 0."""
        if not self._coordination_bound:
            self._coordination_bound = True
            self.registry.register(CoordinationGauges(status))
            for kind in COORDINATION_ERROR_KINDS:
                self._events.coordination_errors.labels(kind)

    def count_coordination_errors(self, kind: str, count: int = 1) -> None:
        """``kind`` is one of ``COORDINATION_ERROR_KINDS``."""
        self._events.coordination_errors.labels(kind).inc(count)

    def count_kv_events(self, pool: str, outcome: str, count: int = 1) -> None:
        """``outcome`` is one of ``KV_EVENT_OUTCOMES``."""
        self._events.kv_events.labels(pool, outcome).inc(count)

    def bind_prefix_cache_sources(self, sources: Callable[[], Iterable[tuple[str, str]]]) -> None:
        """Export ``kvgate_prefix_cache_replicas``, counting the (pool, source) pairs ``sources``
        gives at every scrape."""
        self.registry.register(PrefixCacheSources(sources))

    def set_desired_replicas(
        self,
        pool: str,
        replicas: int,
        reason: str,
        forecast_replicas: float | None = None,
        forecast_error_replicas: float | None = None,
    ) -> None:
        self.signals.set_desired(pool, replicas, reason, forecast_replicas, forecast_error_replicas)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    def signals_doc(self) -> dict[str, Any]:
        """The ``/signals`` document for the current instant."""
        return self.signals.snapshot(self.pool_work())
