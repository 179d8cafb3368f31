"""The wait forecast drains each replica at its own measured pace: the inter-token latency its
learned line predicts at the sequences it runs now, the fleet's smoothed latency until that line
stands."""

from __future__ import annotations

import pytest

from kvgate.admission.decision import Admit, Refusal
from kvgate.admission.itl_guard import MIN_OBSERVATIONS
from kvgate.config.admission import AdmissionConfig, ModelAdmissionConfig
from tests.unit.test_admission_controller import MODEL, Fleet, req

CONFIG = AdmissionConfig(max_queue_wait_s=0.0, models={MODEL: ModelAdmissionConfig(itl_slo_s=0.1)})


def _wait_s(fleet: Fleet) -> float:
    decision = fleet.admit(req(100, 100))
    assert isinstance(decision, Refusal) and decision.retry_after is not None
    return decision.retry_after.expected_s


def _full(config: AdmissionConfig) -> Fleet:
    fleet = Fleet(config, {"a": 1000})
    assert isinstance(fleet.admit(req(100, 800)), Admit)  # 800 tokens to drain
    return fleet


def test_until_a_replica_has_a_line_it_drains_at_the_fleets_latency() -> None:
    fleet = _full(CONFIG)
    guard = fleet.controller.itl_guard
    assert guard is not None
    for _ in range(MIN_OBSERVATIONS - 1):
        guard.observe("a", [MODEL], 1.0, 0.04)
    assert _wait_s(fleet) == pytest.approx(100 / 10_000 + 800 * 0.01)


def test_a_replica_measured_slower_drains_later_and_faster_sooner() -> None:
    waits = []
    for itl_s in (0.04, 0.005):
        fleet = _full(CONFIG)
        guard = fleet.controller.itl_guard
        assert guard is not None
        for _ in range(MIN_OBSERVATIONS):
            guard.observe("a", [MODEL], 1.0, itl_s)
        waits.append(_wait_s(fleet))
    assert waits[0] == pytest.approx(100 / 10_000 + 800 * 0.04)
    assert waits[1] == pytest.approx(100 / 10_000 + 800 * 0.005)


def test_without_an_itl_objective_there_is_no_line_and_the_fleets_latency_stands() -> None:
    fleet = _full(AdmissionConfig(max_queue_wait_s=0.0))
    assert fleet.controller.itl_guard is None
    assert _wait_s(fleet) == pytest.approx(100 / 10_000 + 800 * 0.01)
