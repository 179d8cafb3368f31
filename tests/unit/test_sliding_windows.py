from __future__ import annotations

import math
import random
from bisect import bisect_left
from collections import Counter

import pytest

from kvgate.gateway.telemetry.sliding_windows import (
    BIN_UPPER_BOUNDS,
    CountWindow,
    LatencyWindow,
    ServedWindow,
    bin_counts,
)


def exact_quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def test_latency_quantile_is_within_one_bin_of_exact() -> None:
    rng = random.Random(3)
    window = LatencyWindow(60.0)
    values = [rng.lognormvariate(-1.0, 1.0) for _ in range(5000)]
    for i, v in enumerate(values):
        window.observe(v, now_s=i * 0.01)
    estimate = window.quantile(0.95, now_s=50.0)
    exact = exact_quantile(values, 0.95)
    assert estimate is not None
    assert exact <= estimate <= exact * 1.05


def test_latency_samples_leave_the_window() -> None:
    window = LatencyWindow(60.0)
    window.observe(10.0, now_s=0.0)
    window.observe(0.1, now_s=30.0)
    assert window.quantile(0.95, now_s=59.0) == pytest.approx(10.0, rel=0.05)
    assert window.quantile(0.95, now_s=61.0) == pytest.approx(0.1, rel=0.05)
    assert window.quantile(0.95, now_s=120.0) is None


def test_values_binned_together_land_where_each_would_alone() -> None:
    rng = random.Random(5)
    bounds = (0.001, 0.005, 0.02, 0.1, 1.0)
    on_bounds = [*bounds, *bounds[1:3]]
    for values in ([], [0.0], [2.0, 3.0], on_bounds, [rng.uniform(-0.01, 1.5) for _ in range(200)]):
        values = values + on_bounds[: len(values) % 3]
        rng.shuffle(values)
        counts = bin_counts(bounds, values)
        assert [b for b, _ in counts] == sorted({b for b, _ in counts})
        assert dict(counts) == Counter(bisect_left(bounds, v) for v in values)


def test_bins_cover_llm_latencies() -> None:
    assert BIN_UPPER_BOUNDS[0] <= 0.001
    assert BIN_UPPER_BOUNDS[-1] >= 3600


def test_rates_use_elapsed_time_until_the_window_fills() -> None:
    window = ServedWindow(60.0)
    assert window.rates_per_s(now_s=0.0) == (0.0, 0.0, 0.0)
    for t in range(10):
        window.add(100, 10, now_s=float(t))
    assert window.rates_per_s(now_s=10.0) == pytest.approx((100.0, 10.0, 1.0))
    for t in range(10, 120):
        window.add(100, 10, now_s=float(t))
    assert window.rates_per_s(now_s=119.5) == pytest.approx((100.0, 10.0, 1.0))
    assert window.rates_per_s(now_s=150.0)[0] == pytest.approx(100 * 29 / 60)
    assert window.rates_per_s(now_s=400.0) == (0.0, 0.0, 0.0)


def test_counts_leave_the_window() -> None:
    window = CountWindow(60.0)
    window.add(2, now_s=0.0)
    window.add(3, now_s=30.0)
    assert window.total(now_s=59.0) == 5
    assert window.total(now_s=61.0) == 3
    assert window.total(now_s=120.0) == 0
