from __future__ import annotations

import pytest

from kvgate.autoscaler.signals import pool_signals
from kvgate.vocabulary.replica import Role
from tests.unit.test_metrics import FakeClock, populated


def test_snapshot_carries_work_latency_and_rates() -> None:
    clock = FakeClock()
    metrics = populated(clock)
    clock.now_s += 2.0
    doc = metrics.signals_doc()
    assert doc["window_s"] == 60.0
    decode = doc["pools"]["decode"]
    assert decode["role"] == "decode"
    assert (decode["replicas_current"], decode["replicas_ready"], decode["replicas_warming"]) == (2, 2, 1)
    assert decode["resident_sequences"] == 5
    assert decode["remaining_decode_tokens"] == 2500
    assert decode["kv_occupancy_scraped_ratio"] == 0.8
    assert decode["ttft_p95_s"] == pytest.approx(0.4, rel=0.05)
    assert decode["itl_p95_s"] == pytest.approx(0.02, rel=0.05)
    assert decode["prompt_tokens_per_s"] == pytest.approx(120 / 2.0)
    assert decode["decisions"] == {"admit": 1, "reject": 1}
    assert (decode["desired_replicas"], decode["desired_reason"]) == (3, "hold")
    assert doc["pools"]["prefill"]["queued_prompt_tokens"] == 3000
    clock.now_s += 120.0
    later = metrics.signals_doc()["pools"]["decode"]
    assert later["ttft_p95_s"] is None
    assert later["prompt_tokens_per_s"] == 0.0
    assert later["resident_sequences"] == 5, "work is state, not a windowed event"


def test_policy_input_prefers_the_scraped_occupancy() -> None:
    doc = populated().signals_doc()
    by_pool = {s.pool: s for s in pool_signals(doc, time_s=42.0)}
    assert by_pool["decode"].kv_occupancy_ratio == 0.8
    assert by_pool["decode"].role is Role.DECODE
    assert by_pool["prefill"].prompt_tokens_queued == 4000
    assert by_pool["prefill"].time_s == 42.0
    doc["pools"]["decode"]["kv_occupancy_scraped_ratio"] = None
    fallback = {s.pool: s for s in pool_signals(doc, time_s=42.0)}["decode"]
    assert fallback.kv_occupancy_ratio == pytest.approx(0.7)
