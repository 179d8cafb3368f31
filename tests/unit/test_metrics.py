from __future__ import annotations

import importlib.metadata
import platform
from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvgate.admission.coordination_gate import CoordinationStatus
from kvgate.gateway.edge.errors import (
    BadGateway,
    BadRequest,
    GatewayTimeout,
    InternalError,
    MethodNotAllowed,
    ModelNotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    TooManyRequests,
    Unauthorized,
)
from kvgate.gateway.replicas.replica_errors import (
    ReplicaConnectError,
    ReplicaDisconnected,
    ReplicaProtocolError,
    ReplicaTimeout,
)
from kvgate.gateway.state import ReplicaState, replica_name
from kvgate.gateway.telemetry.event_series import (
    COUNTERS,
    HISTOGRAMS,
    ITL_BUCKETS_S,
    RETRY_OUTCOMES,
    UPSTREAM_ERROR_KINDS,
)
from kvgate.gateway.telemetry.gauges import COORDINATION_SERIES, INFO_GAUGES, PROMISE_OUTCOMES, WORK_GAUGES
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.gateway.telemetry.pool_work import ModelWork, PoolWork, ReplicaWork
from kvgate.vocabulary.replica import Role

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class StaticWork:
    def __init__(self, pools: list[PoolWork]) -> None:
        self.pools = pools

    def pool_work(self) -> Iterable[PoolWork]:
        return self.pools


def busy_pools() -> list[PoolWork]:
    return [
        PoolWork(
            "prefill",
            Role.PREFILL,
            (ModelWork(MODEL, queued_requests=2, queued_prompt_tokens=3000, pending_prompt_tokens=1000),),
            (ReplicaWork("http://p0:8000", 10000, 0.2, 0.1, ready=True),),
        ),
        PoolWork(
            "decode",
            Role.DECODE,
            (ModelWork(MODEL, resident_sequences=5, remaining_decode_tokens=2500),),
            (
                ReplicaWork("http://d0:8000", 30000, 0.9, 0.8, ready=True),
                ReplicaWork("http://d1:8000", 10000, 0.1, None, ready=True, warming=True),
            ),
        ),
    ]


def populated(clock: FakeClock | None = None) -> GatewayMetrics:
    """A GatewayMetrics with every metric carrying at least one sample."""
    metrics = GatewayMetrics(StaticWork(busy_pools()), clock=clock or FakeClock())
    for pool in ("prefill", "decode"):
        metrics.observe_ttft(pool, MODEL, 0.4)
        metrics.observe_queue_wait(pool, MODEL, 0.1)
        metrics.observe_queue_forecast(pool, MODEL, 0.1, 0.3, 2.0)
        metrics.record_response(pool, MODEL, None, 3.0, (0.02,), 120, 30, estimated_prompt_tokens=60)
        metrics.count_decision("admit", "fits", pool=pool, model=MODEL)
        metrics.set_desired_replicas(pool, 3, "hold")
        metrics.declare_pool(pool)
    metrics.count_decision("reject", "queue_full", pool="decode", model=MODEL)
    metrics.count_relayed(200)
    metrics.observe_health(replica(), ejected=True)
    return metrics


def samples(metrics: GatewayMetrics) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(series: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    matches = [v for lbl, v in series[name] if all(lbl.get(k) == want for k, want in labels.items())]
    assert len(matches) == 1, (name, labels, series.get(name))
    return matches[0]


def test_every_declared_series_is_exported() -> None:
    series = samples(populated())
    for name in WORK_GAUGES + COUNTERS + INFO_GAUGES:
        assert name in series, name
    for name in HISTOGRAMS:
        for suffix in ("_bucket", "_sum", "_count"):
            assert name + suffix in series, name + suffix


def test_work_gauges_report_the_source_state() -> None:
    series = samples(populated())
    assert value(series, "kvgate_prefill_work_tokens", pool="prefill", model=MODEL) == 4000
    assert value(series, "kvgate_queued_prompt_tokens", pool="prefill") == 3000
    assert value(series, "kvgate_remaining_decode_tokens", pool="decode") == 2500
    assert value(series, "kvgate_resident_sequences", pool="decode") == 5
    est = value(series, "kvgate_pool_kv_occupancy_ratio", pool="decode", source="estimate")
    assert abs(est - (30000 * 0.9 + 10000 * 0.1) / 40000) < 1e-9
    assert value(series, "kvgate_pool_kv_occupancy_ratio", pool="decode", source="scraped") == 0.8
    assert (
        value(series, "kvgate_replica_kv_occupancy_ratio", replica="http://d0:8000", source="scraped") == 0.8
    )
    assert ("http://d1:8000", "scraped") not in {
        (lbl["replica"], lbl["source"]) for lbl, _ in series["kvgate_replica_kv_occupancy_ratio"]
    }
    assert value(series, "kvgate_replica_warming", replica="http://d1:8000") == 1
    assert value(series, "kvgate_pool_replicas", pool="decode", state="ready") == 2


def test_work_gauges_follow_the_source_down_to_zero() -> None:
    source = StaticWork(busy_pools())
    metrics = GatewayMetrics(source, clock=FakeClock())
    assert value(samples(metrics), "kvgate_resident_sequences", pool="decode") == 5
    source.pools = [PoolWork(p.pool, p.role, (ModelWork(MODEL),), p.replicas) for p in busy_pools()]
    series = samples(metrics)
    for name in ("kvgate_prefill_work_tokens", "kvgate_resident_sequences", "kvgate_remaining_decode_tokens"):
        assert {v for _, v in series[name]} == {0.0}


def test_counters_and_histograms_count_events() -> None:
    series = samples(populated())
    assert value(series, "kvgate_admission_decisions_total", pool="decode", decision="reject") == 1
    assert value(series, "kvgate_prompt_tokens_total", pool="decode") == 120
    assert value(series, "kvgate_output_tokens_total", pool="prefill") == 30
    assert value(series, "kvgate_time_to_first_token_seconds_count", pool="decode") == 1
    assert value(series, "kvgate_time_to_first_token_seconds_bucket", pool="decode", le="0.5") == 1
    assert value(series, "kvgate_time_to_first_token_seconds_bucket", pool="decode", le="0.25") == 0
    assert value(series, "kvgate_request_duration_seconds_sum", pool="decode") == 3.0
    assert value(series, "kvgate_inter_token_latency_seconds_count", pool="prefill") == 1
    assert value(series, "kvgate_tokenizer_estimate_ratio_count", model=MODEL) == 2
    assert value(series, "kvgate_tokenizer_estimate_ratio_sum", model=MODEL) == 1.0


def test_desired_replicas_keeps_only_the_last_reason() -> None:
    metrics = populated()
    metrics.set_desired_replicas("decode", 5, "scale_out_occupancy_itl")
    series = samples(metrics)
    assert value(series, "kvgate_autoscaler_desired_replicas", pool="decode") == 5
    reasons = [
        lbl["reason"] for lbl, _ in series["kvgate_autoscaler_decision_info"] if lbl["pool"] == "decode"
    ]
    assert reasons == ["scale_out_occupancy_itl"]


def test_instances_do_not_share_a_registry() -> None:
    a, b = populated(), GatewayMetrics()
    assert "kvgate_prompt_tokens_total" in samples(a)
    assert "kvgate_prompt_tokens_total" not in samples(b)


def test_labelled_children_are_cached() -> None:
    metrics = populated()
    before = (len(metrics._decided), len(metrics._series))
    for _ in range(100):
        metrics.observe_ttft("decode", MODEL, 0.1)
        metrics.record_response("decode", MODEL, 0.1, 1.0, (0.01,), 1, 1, 1)
        metrics.count_decision("admit", "fits", pool="decode", model=MODEL)
        metrics.count_admitted("decode", MODEL, "fits", 0.1)
    assert (len(metrics._decided), len(metrics._series)) == before


def test_every_metric_is_documented() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "autoscaling.md").read_text()
    missing = [name for name in WORK_GAUGES + HISTOGRAMS + COUNTERS + INFO_GAUGES if f"`{name}`" not in doc]
    assert not missing


def test_coordination_series_are_exported_once_bound_and_documented() -> None:
    metrics = GatewayMetrics(clock=FakeClock())
    assert not set(COORDINATION_SERIES) & set(samples(metrics))
    status = CoordinationStatus(
        up=True, last_sync_age_s=2.0, refusing=False, gateways=2, claims=(("r0", 500, 4),)
    )
    metrics.bind_coordination(lambda: status)
    series = samples(metrics)
    assert set(COORDINATION_SERIES) <= set(series)
    assert value(series, "kvgate_coordination_errors_total", kind="timeout") == 0
    assert value(series, "kvgate_coordination_claim_kv_tokens", replica="r0") == 500
    doc = (Path(__file__).parents[2] / "docs" / "gateway.md").read_text()
    assert [name for name in COORDINATION_SERIES if f"`{name}" not in doc] == []


def test_itl_gaps_are_binned_in_one_call_like_single_observations() -> None:
    clock = FakeClock()
    bulk = GatewayMetrics(StaticWork(busy_pools()), clock=clock)
    single = GatewayMetrics(StaticWork(busy_pools()), clock=clock)
    gaps = [0.004, 0.005, 0.02, 0.02, 0.3, 3.0]
    bulk.record_response("decode", MODEL, None, 4.0, gaps)
    for gap in gaps:
        single.record_response("decode", MODEL, None, 4.0, (gap,))
    itl = "kvgate_inter_token_latency_seconds"
    got, want = samples(bulk), samples(single)
    for suffix in ("_bucket", "_count", "_sum"):
        assert got[itl + suffix] == want[itl + suffix]
    assert value(got, itl + "_bucket", le="0.005") == 2.0
    assert value(got, itl + "_bucket", le="0.02") == 4.0
    assert value(got, itl + "_bucket", le="+Inf") == 6.0
    assert value(got, itl + "_sum") == sum(gaps)
    p95 = bulk.signals_doc()["pools"]["decode"]["itl_p95_s"]
    assert p95 == single.signals_doc()["pools"]["decode"]["itl_p95_s"]
    assert p95 is not None and p95 >= 3.0


def test_histograms_are_written_as_prometheus_client_writes_them() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    metrics = GatewayMetrics(clock=FakeClock())
    registry = CollectorRegistry()
    reference = Histogram(
        "kvgate_inter_token_latency_seconds",
        "Seconds between consecutive output tokens of a streamed response.",
        ["pool", "model"],
        buckets=ITL_BUCKETS_S,
        registry=registry,
    )
    for gap in (0.001, 0.01, 0.2, 9.0):
        reference.labels("decode", MODEL).observe(gap)
    metrics.record_response("decode", MODEL, None, 10.0, (0.001, 0.01, 0.2, 9.0))

    def itl_lines(text: bytes) -> list[str]:
        return [
            line
            for line in text.decode().splitlines()
            if "kvgate_inter_token_latency_seconds" in line and "_created{" not in line
        ]

    assert itl_lines(metrics.render()) == itl_lines(generate_latest(registry))


def test_counters_are_written_as_prometheus_client_writes_them() -> None:
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    metrics = GatewayMetrics(clock=FakeClock())
    registry = CollectorRegistry()
    reference = Counter(
        "kvgate_admission_decisions",
        "Admission decisions by outcome (admit, queue, reject) and reason.",
        ["pool", "model", "decision", "reason"],
        registry=registry,
    )
    tokens = Counter(
        "kvgate_prompt_tokens",
        "Prompt tokens of requests served (replica's count).",
        ["pool", "model"],
        registry=registry,
    )
    for pool, decision, reason in (
        ("decode", "admit", "fits"),
        ("", "reject", "no_replica"),
        ("decode", "queue", "kv_capacity"),
    ):
        reference.labels(pool, MODEL, decision, reason).inc()
    reference.labels("decode", MODEL, "admit", "fits").inc()
    tokens.labels("decode", MODEL).inc(120)
    metrics.count_admitted("decode", MODEL, "fits", None)
    metrics.count_decision("reject", "no_replica", pool="", model=MODEL)
    metrics.count_decision("queue", "kv_capacity", pool="decode", model=MODEL)
    metrics.count_admitted("decode", MODEL, "fits", 0.5)
    metrics.record_response("decode", MODEL, 0.2, 1.0, (), 120, 30)

    def counter_lines(text: bytes) -> list[str]:
        """Every line of the two counters, each ``_created`` sample without its (wall-clock) value."""
        wanted = ("kvgate_admission_decisions", "kvgate_prompt_tokens")
        return [
            line.rpartition(" ")[0] if "_created{" in line else line
            for line in text.decode().splitlines()
            if any(name in line for name in wanted)
        ]

    assert counter_lines(metrics.render()) == counter_lines(generate_latest(registry))


def replica(url: str = "http://10.0.0.7:8000", pool: str = "decode") -> ReplicaState:
    return ReplicaState(
        url, url, pool, Role.DECODE, frozenset({MODEL}), 1000, 8, name=replica_name(pool, url)
    )


def test_responses_are_counted_by_code_and_reason() -> None:
    metrics = GatewayMetrics(clock=FakeClock())
    for status in (200, 200, 400):
        metrics.count_relayed(status)
    for error in (
        TooManyRequests("full", reason="queue_full"),
        TooManyRequests("late", reason="deadline"),
        ServiceUnavailable("none", reason="no_replica"),
        ServiceUnavailable("blind", reason="coordination_unavailable"),
        BadRequest("too long", reason="invalid_request"),
        BadRequest("not JSON"),
        ModelNotFound("gpt-9"),
        PayloadTooLarge("big"),
        Unauthorized("who"),
        MethodNotAllowed("GET"),
        BadGateway("replica failed"),
        GatewayTimeout("replica timed out"),
        TooManyRequests("replica saturated"),
        ServiceUnavailable("replica unavailable (503)", retry_after_s=1.0),
        InternalError("bug"),
    ):
        metrics.count_error(error)
    metrics.count_error(BadRequest("still not JSON"))
    got = {(lbl["code"], lbl["reason"]): v for lbl, v in samples(metrics)["kvgate_responses_total"]}
    assert got == {
        ("200", "replica"): 2,
        ("400", "replica"): 1,
        ("429", "queue_full"): 1,
        ("429", "deadline"): 1,
        ("503", "no_replica"): 1,
        ("503", "coordination_unavailable"): 1,
        ("400", "invalid_request"): 3,
        ("404", "model_not_found"): 1,
        ("413", "payload_too_large"): 1,
        ("401", "unauthorized"): 1,
        ("405", "method_not_allowed"): 1,
        ("502", "upstream_error"): 1,
        ("504", "upstream_timeout"): 1,
        ("429", "upstream_saturated"): 1,
        ("503", "upstream_unavailable"): 1,
        ("500", "internal"): 1,
    }


def test_a_replica_is_declared_at_zero_by_its_first_health_outcome() -> None:
    metrics = GatewayMetrics(clock=FakeClock())
    r = replica()
    metrics.observe_health(r, ejected=False)
    series = samples(metrics)
    kinds = {lbl["kind"]: v for lbl, v in series["kvgate_upstream_errors_total"] if lbl["replica"] == r.name}
    assert kinds == dict.fromkeys(UPSTREAM_ERROR_KINDS, 0.0)
    assert value(series, "kvgate_replica_ejections_total", pool="decode", replica=r.name) == 0


def test_upstream_errors_are_counted_by_kind_and_replica_name_never_its_url() -> None:
    metrics = GatewayMetrics(clock=FakeClock())
    a, b = replica(), replica("http://10.0.0.8:8000")
    for r, exc in (
        (a, ReplicaConnectError(ConnectionRefusedError(111, "refused"))),
        (a, ReplicaConnectError(ConnectionRefusedError(111, "refused"))),
        (a, ReplicaTimeout("first byte")),
        (a, TimeoutError()),
        (b, ReplicaDisconnected("closed")),
        (b, ReplicaProtocolError("garbage")),
        (b, BadGateway("replica answered 500")),
        (b, ServiceUnavailable("replica unavailable (503)")),
        (b, TooManyRequests("replica saturated (429)")),
        (b, RuntimeError("a bug")),
    ):
        metrics.count_upstream_error(r, exc)
    series = samples(metrics)["kvgate_upstream_errors_total"]
    got = {(lbl["pool"], lbl["replica"], lbl["kind"]): v for lbl, v in series if v}
    assert got == {
        ("decode", a.name, "connect"): 2,
        ("decode", a.name, "timeout"): 2,
        ("decode", b.name, "disconnected"): 1,
        ("decode", b.name, "protocol"): 1,
        ("decode", b.name, "status_5xx"): 2,
        ("decode", b.name, "status_429"): 1,
        ("decode", b.name, "other"): 1,
    }
    assert {lbl["kind"] for lbl, _ in series} == set(UPSTREAM_ERROR_KINDS)
    assert not any("http" in lbl["replica"] for lbl, _ in series)


def test_ejections_count_and_a_removed_replica_takes_its_series_along() -> None:
    metrics = GatewayMetrics(clock=FakeClock())
    a, b = replica(), replica("http://10.0.0.8:8000")
    for r, ejected in ((a, False), (a, True), (b, False), (a, False), (a, True)):
        metrics.observe_health(r, ejected=ejected)
    metrics.count_upstream_error(b, ReplicaDisconnected("closed"))
    series = samples(metrics)
    assert value(series, "kvgate_replica_ejections_total", replica=a.name) == 2
    assert value(series, "kvgate_replica_ejections_total", replica=b.name) == 0
    metrics.forget_replica(b.replica_id)
    series = samples(metrics)
    for name in ("kvgate_replica_ejections_total", "kvgate_upstream_errors_total"):
        assert {lbl["replica"] for lbl, _ in series[name]} == {a.name}, name


def test_retries_and_expired_reservations_of_a_pool_start_at_zero() -> None:
    metrics = GatewayMetrics(clock=FakeClock())
    metrics.declare_pool("decode")
    series = samples(metrics)
    outcomes = {lbl["outcome"]: v for lbl, v in series["kvgate_retries_total"] if lbl["pool"] == "decode"}
    assert outcomes == dict.fromkeys(RETRY_OUTCOMES, 0.0)
    assert value(series, "kvgate_reservations_expired_total", pool="decode") == 0
    metrics.count_retry("decode", "retry")
    metrics.count_retry("decode", "retry")
    metrics.count_retry("decode", "retry_budget")
    series = samples(metrics)
    assert value(series, "kvgate_retries_total", pool="decode", outcome="retry") == 2
    assert value(series, "kvgate_retries_total", pool="decode", outcome="retry_budget") == 1
    assert value(series, "kvgate_retries_total", pool="decode", outcome="max_retries") == 0


def test_build_info_names_the_installed_version_and_the_python() -> None:
    series = samples(GatewayMetrics(clock=FakeClock()))
    labels = {"version": importlib.metadata.version("kvgate"), "python": platform.python_version()}
    assert value(series, "kvgate_build_info", **labels) == 1


def test_process_metrics_are_on_the_gateways_own_registry() -> None:
    series = samples(GatewayMetrics(clock=FakeClock()))
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
        "python_info",
        "python_gc_collections_total",
    ):
        assert name in series, name
    assert "process_cpu_seconds_total" in samples(populated()), "every instance has its own"


def test_response_and_replica_children_are_cached() -> None:
    metrics = GatewayMetrics(clock=FakeClock())
    r = replica()
    metrics.count_relayed(200)
    metrics.count_error(BadRequest("x"))
    metrics.observe_health(r, ejected=False)
    sizes = (len(metrics._relayed), len(metrics._refused), len(metrics._replicas))
    for _ in range(100):
        metrics.count_relayed(200)
        metrics.count_error(BadRequest("x"))
        metrics.observe_health(r, ejected=False)
        metrics.count_upstream_error(r, ReplicaDisconnected("closed"))
    assert (len(metrics._relayed), len(metrics._refused), len(metrics._replicas)) == sizes


def test_queue_forecast_is_recorded_as_error_and_share_of_budget() -> None:
    metrics = GatewayMetrics(clock=FakeClock())
    metrics.observe_queue_forecast("p", MODEL, 1.5, 1.0, 3.0)
    metrics.observe_queue_forecast("p", MODEL, 4.0, 1.0, 4.0)
    series = samples(metrics)
    error = "kvgate_queue_wait_forecast_error_seconds"
    assert value(series, error + "_sum", pool="p") == pytest.approx(0.5 + 3.0)
    assert value(series, error + "_bucket", pool="p", le="0.5") == 1
    ratio = "kvgate_queue_wait_budget_ratio"
    assert value(series, ratio + "_bucket", pool="p", le="0.5") == 1, "1.5 of 3 s"
    assert value(series, ratio + "_bucket", pool="p", le="0.99") == 1, "the other at its deadline"


def test_promise_outcomes_are_read_at_scrape_time() -> None:
    from kvgate.admission.promises import PromiseCounts

    counts = PromiseCounts()
    metrics = GatewayMetrics(clock=FakeClock())
    metrics.bind_promises(lambda: counts)
    counts.made, counts.kept, counts.lapsed = 3, 2, 1
    series = samples(metrics)
    assert [value(series, "kvgate_promises_total", outcome=o) for o in PROMISE_OUTCOMES] == [3, 2, 0, 1]


def test_the_forecast_and_its_error_are_exported_once_the_policy_has_them() -> None:
    metrics = populated()
    assert "kvgate_autoscaler_forecast_replicas" not in samples(metrics)
    metrics.set_desired_replicas("decode", 5, "scale_out_forecast", 4.6, -0.8)
    series = samples(metrics)
    assert value(series, "kvgate_autoscaler_forecast_replicas", pool="decode") == 4.6
    assert value(series, "kvgate_autoscaler_forecast_error_replicas", pool="decode") == -0.8
    assert "prefill" not in {labels["pool"] for labels, _ in series["kvgate_autoscaler_forecast_replicas"]}
