"""Promises against spare capacity: with a TTFT objective, a Retry-After is booked only where new
arrivals leave room for it (``kvgate.admission.pressure``)."""

from __future__ import annotations

import math

import pytest

from kvgate.admission.decision import Admit, Refusal
from kvgate.admission.pressure import ArrivalPressure
from kvgate.config.admission import AdmissionConfig, ModelAdmissionConfig
from tests.unit.test_admission_controller import MODEL
from tests.unit.test_admission_promises import freq, full_fleet, refused


def test_a_fleet_never_saturated_has_no_pressure() -> None:
    pressure = ArrivalPressure(window_s=10)
    for second in range(10):
        pressure.arrived(1000, second + 0.5)
        pressure.admitted(1000, second + 0.5)
    assert pressure.ratio(10.0) is None
    assert pressure.stretch(4.0, 10.0) == 4.0


def test_arrivals_at_twice_the_saturated_admissions_leave_nothing_to_promise() -> None:
    pressure = ArrivalPressure(window_s=10)
    for second in range(10):
        pressure.arrived(2000, second + 0.5)
        pressure.admitted(1000, second + 0.5)
        pressure.saturated(second + 0.5)
    assert pressure.ratio(9.9) == pytest.approx(2.0)
    assert pressure.stretch(4.0, 9.9) == math.inf


def test_spare_capacity_stretches_the_wait_by_the_share_arrivals_take() -> None:
    pressure = ArrivalPressure(window_s=10)
    for second in range(10):
        pressure.arrived(500, second + 0.5)
        pressure.admitted(1000, second + 0.5)
    pressure.saturated(9.5)
    assert pressure.ratio(9.9) == pytest.approx(0.5)
    assert pressure.stretch(4.0, 9.9) == pytest.approx(8.0)


def test_the_window_forgets_a_burst() -> None:
    pressure = ArrivalPressure(window_s=10)
    pressure.arrived(50_000, 0.5)
    pressure.admitted(1000, 0.5)
    pressure.saturated(0.5)
    assert pressure.stretch(1.0, 5.0) == math.inf
    assert pressure.ratio(11.0) is None


def _overloaded(config: AdmissionConfig) -> Refusal:
    """New requests, each refused, arriving at a full replica for a while; the last refusal."""
    fleet, _ = full_fleet(config)
    refusal = None
    for i in range(8):
        fleet.now_s = i * 0.5
        refusal = refused(fleet, freq(f"new-{i}".encode()))
    assert refusal is not None
    return refusal


def test_under_sustained_overload_a_request_with_a_ttft_objective_is_told_not_to_retry() -> None:
    config = AdmissionConfig(
        max_queue_wait_s=0.0, promise_grace_s=1.0, models={MODEL: ModelAdmissionConfig(ttft_slo_s=2.0)}
    )
    refusal = _overloaded(config)
    assert refusal.retry_after is not None and not refusal.retry_after.honest
    assert refusal.retry_after.headers()["x-should-retry"] == "false"
    assert "arrive faster" in refusal.message


def test_without_a_ttft_objective_the_same_overload_still_promises() -> None:
    refusal = _overloaded(AdmissionConfig(max_queue_wait_s=0.0, promise_grace_s=1.0))
    assert refusal.retry_after is not None and refusal.retry_after.honest


def test_a_promise_made_with_spare_capacity_is_kept() -> None:
    config = AdmissionConfig(
        max_queue_wait_s=0.0, promise_grace_s=1.0, models={MODEL: ModelAdmissionConfig(ttft_slo_s=2.0)}
    )
    fleet, resident = full_fleet(config)
    first = refused(fleet, freq(b"c"))
    assert first.retry_after is not None and first.retry_after.honest
    assert fleet.controller.queue_stats(fleet.now_s).promised_requests == 1
    fleet.now_s = first.retry_after.expected_s
    fleet.release(resident[0].request_id)
    assert isinstance(fleet.admit(freq(b"c", retry=1)), Admit)
    assert fleet.controller.promise_counts.kept == 1
