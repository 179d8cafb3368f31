from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import COUNTERS, HISTOGRAMS, WORK_GAUGES, GatewayMetrics
from gateway.signals import ModelWork, PoolWork, ReplicaWork
from routing.replica import Role

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
        metrics.observe_itl(pool, MODEL, 0.02)
        metrics.observe_queue_wait(pool, MODEL, 0.1)
        metrics.observe_e2e(pool, MODEL, 3.0)
        metrics.count_tokens(pool, MODEL, 120, 30)
        metrics.count_decision("admit", "fits", pool=pool, model=MODEL)
        metrics.set_desired_replicas(pool, 3, "hold")
        metrics.count_expired(pool, 0)
    metrics.count_decision("reject", "queue_full", pool="decode", model=MODEL)
    metrics.observe_tokenizer_ratio(MODEL, 98, 100)
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
    for name in WORK_GAUGES + COUNTERS:
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
    assert value(series, "kvgate_tokenizer_estimate_ratio_sum", model=MODEL) == 0.98


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
        metrics.count_tokens("decode", MODEL, 1, 1)
        metrics.count_decision("admit", "fits", pool="decode", model=MODEL)
        metrics.count_admitted("decode", MODEL, "fits", 0.1)
    assert (len(metrics._decided), len(metrics._series)) == before


def test_every_metric_is_documented() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "autoscaling.md").read_text()
    missing = [name for name in WORK_GAUGES + HISTOGRAMS + COUNTERS if f"`{name}`" not in doc]
    assert not missing


def test_itl_gaps_are_binned_in_one_call_like_single_observations() -> None:
    clock = FakeClock()
    bulk = GatewayMetrics(clock=clock)
    single = GatewayMetrics(clock=clock)
    gaps = [0.004, 0.005, 0.02, 0.02, 0.3, 3.0]
    bulk.observe_itl_gaps("decode", MODEL, gaps)
    for gap in gaps:
        single.observe_itl("decode", MODEL, gap)
    itl = "kvgate_inter_token_latency_seconds"
    got, want = samples(bulk), samples(single)
    for suffix in ("_bucket", "_count", "_sum"):
        assert got[itl + suffix] == want[itl + suffix]
    assert value(got, itl + "_bucket", le="0.005") == 2.0
    assert value(got, itl + "_bucket", le="0.02") == 4.0
    assert value(got, itl + "_bucket", le="+Inf") == 6.0
    assert value(got, itl + "_sum") == sum(gaps)
    window = bulk.signals.pool_windows("decode").latency["itl"]
    assert window.count(clock.now_s) == len(gaps)
    p95 = window.quantile(0.95, clock.now_s)
    assert p95 is not None and p95 >= 3.0


def test_histograms_are_written_as_prometheus_client_writes_them() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from gateway.metrics import ITL_BUCKETS_S

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
    metrics.observe_itl_gaps("decode", MODEL, (0.001, 0.01, 0.2, 9.0))

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
    metrics.count_tokens("decode", MODEL, 120, 30)

    def counter_lines(text: bytes) -> list[str]:
        """Every line of the two counters, each ``_created`` sample without its (wall-clock) value."""
        wanted = ("kvgate_admission_decisions", "kvgate_prompt_tokens")
        return [
            line.rpartition(" ")[0] if "_created{" in line else line
            for line in text.decode().splitlines()
            if any(name in line for name in wanted)
        ]

    assert counter_lines(metrics.render()) == counter_lines(generate_latest(registry))
