import math

import pytest

from kvgate.loadtest.client import RequestRecord
from kvgate.loadtest.plots import signal_series, timeline
from kvgate.loadtest.report import Slo, class_table, percentile, summarize
from kvgate.loadtest.runner import RunResult, SignalSample, Target

SLO = Slo(ttft_s=1.0, itl_s=0.05)


def _record(index: int, **changes: object) -> RequestRecord:
    values: dict[str, object] = {
        "index": index,
        "class_name": "c",
        "scheduled_at_s": float(index),
        "sent_at_s": float(index) + 0.001,
        "status": 200,
        "error": None,
        "ttft_s": 0.1 * (index + 1),
        "itl_s": (0.01, 0.01),
        "e2e_s": 0.5,
        "prompt_tokens": 100,
        "completion_tokens": 3,
        "retries": 0,
        "wait_honoured_s": 0.0,
    }
    values.update(changes)
    return RequestRecord(**values)  # type: ignore[arg-type]


def _result(records: list[RequestRecord], cpu_s: float = 0.1, wall_s: float = 10.0) -> RunResult:
    return RunResult(
        target=Target("t", "http://x"),
        model="m",
        records=tuple(records),
        wall_s=wall_s,
        cpu_s=cpu_s,
        signals=(),
        started_epoch_s=0.0,
        closed_loop=False,
    )


def test_percentile_interpolates() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert percentile([0.0, 10.0], 0.95) == pytest.approx(9.5)


def test_summary_counts_goodput_rejects_and_tokens() -> None:
    records = [_record(i) for i in range(10)]
    records.append(_record(10, status=429, ttft_s=None, itl_s=(), prompt_tokens=0, completion_tokens=0))
    records.append(_record(11, status=500, error="boom", ttft_s=None, itl_s=(), completion_tokens=0))
    summary = summarize(_result(records), SLO)
    assert summary.requests == 12
    assert summary.ok == 10
    assert summary.rejects == 1
    assert summary.errors == 1
    assert summary.goodput_requests == 10
    assert summary.goodput_rps == pytest.approx(1.0)
    assert summary.prompt_tokens == 1100
    assert summary.completion_tokens == 30
    assert summary.schedule_kept
    assert not summary.cpu_bound
    assert summary.cpu_per_request_ms == pytest.approx(100.0 / 12)


def test_summary_flags_lag_and_cpu_bound_generators() -> None:
    records = [_record(i, sent_at_s=float(i) + 0.5) for i in range(10)]
    summary = summarize(_result(records, cpu_s=9.0, wall_s=10.0), SLO)
    assert not summary.schedule_kept
    assert summary.cpu_bound
    warnings = " ".join(summary.warnings())
    assert "could not keep the schedule" in warnings
    assert "distorted" in warnings


def test_timeline_buckets_by_second() -> None:
    records = [_record(0, sent_at_s=0.2, e2e_s=0.1), _record(1, sent_at_s=1.5, e2e_s=0.2, status=429)]
    series = timeline(records, SLO)
    assert series["sent"] == [1.0, 1.0]
    assert series["goodput"] == [1.0, 0.0]
    assert series["rejects"] == [0.0, 1.0]


def test_signal_series_prefers_scraped_occupancy_and_tolerates_junk() -> None:
    samples = [
        SignalSample(
            1.0,
            {
                "pools": {
                    "default": {
                        "queued_requests": 2,
                        "queued_prompt_tokens": 300,
                        "kv_occupancy_estimate_ratio": 0.5,
                        "kv_occupancy_scraped_ratio": 0.4,
                    }
                }
            },
        ),
        SignalSample(2.0, {"pools": {"default": {"kv_occupancy_estimate_ratio": 0.6}}}),
        SignalSample(3.0, {"unrelated": True}),
    ]
    series = signal_series(samples)
    assert series["default"]["t_s"] == [1.0, 2.0]
    assert series["default"]["kv_occupancy_scraped_ratio"][0] == 0.4
    assert math.isnan(series["default"]["kv_occupancy_scraped_ratio"][1])
    assert series["default"]["kv_occupancy_estimate_ratio"] == [0.5, 0.6]
    assert series["default"]["queued_prompt_tokens"] == [300.0, 0.0]
    assert series["default"]["queued_requests"] == [2.0, 0.0]


def test_class_table_splits_goodput_by_class() -> None:
    records = [_record(0, class_name="short"), _record(1, class_name="long", ttft_s=3.0)]
    table = class_table([_result(records)], SLO)
    rows = table.splitlines()[2:]
    assert rows[0].startswith("| t | long | 1 | 0.0% |")
    assert rows[1].startswith("| t | short | 1 | 100.0% |")
