"""The wait forecast drains each replica at its own measured pace: the inter-token latency its
learned line predicts at the sequences it runs now, the fleet's smoothed latency until that line
stands; and what it has missed by lately keeps the queue from admitting what it would serve past a
TTFT objective."""

from __future__ import annotations

import pytest

from kvgate.admission.decision import Admit, Decision, Queue, Refusal, RefusalReason
from kvgate.admission.forecast import MARGIN_MIN_OBSERVED, ForecastMargin
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


def test_the_margin_is_a_high_quantile_of_recent_misses_and_never_below_zero() -> None:
    margin = ForecastMargin(quantile=0.9, window=10, min_observed=5)
    for _ in range(4):
        margin.observe(3.0)
    assert margin.margin_s == 0.0, "too few departures yet"
    margin.observe(3.0)
    assert margin.margin_s == 3.0
    for _ in range(10):
        margin.observe(-1.0)
    assert margin.margin_s == 0.0, "the window forgot the misses; early departures are no margin"
    for error_s in [0.1 * i for i in range(10)]:
        margin.observe(error_s)
    assert margin.margin_s == pytest.approx(0.8)


def test_a_request_bounded_by_its_ttft_objective_is_queued_only_with_room_for_recent_misses() -> None:
    config = AdmissionConfig(max_queue_wait_s=30.0, models={MODEL: ModelAdmissionConfig(ttft_slo_s=10.0)})
    fleet = Fleet(config, {"a": 1000})

    def one_wait() -> Decision:
        holder = req(100, 850)
        assert isinstance(fleet.admit(holder), Admit)
        return fleet.admit(req(10, 90))  # 100 tokens: behind the holder's ~8.5 s

    for _ in range(MARGIN_MIN_OBSERVED):
        queued = one_wait()
        assert isinstance(queued, Queue) and queued.expected_wait_s == pytest.approx(8.5, abs=0.05)
        fleet.now_s += queued.expected_wait_s + 2.0  # the holder finishes later than forecast
        holder_id = next(iter(fleet.ledger.resident("a"))).request_id
        dispatched = fleet.release(holder_id)
        assert len(dispatched) == 1
        fleet.release(dispatched[0].request.request_id)
    refused = one_wait()
    assert isinstance(refused, Refusal) and refused.reason is RefusalReason.TTFT_SLO, (
        "8.5 s forecast + 2 s late is past the 10 s objective"
    )


def test_without_a_ttft_objective_the_queue_keeps_its_limit() -> None:
    fleet = Fleet(AdmissionConfig(max_queue_wait_s=9.0), {"a": 1000})
    for _ in range(MARGIN_MIN_OBSERVED):
        assert isinstance(fleet.admit(req(100, 850)), Admit)
        queued = fleet.admit(req(10, 90))
        assert isinstance(queued, Queue)
        fleet.now_s += queued.expected_wait_s + 2.0
        holder_id = next(iter(fleet.ledger.resident("a"))).request_id
        fleet.release(fleet.release(holder_id)[0].request.request_id)
    assert isinstance(fleet.admit(req(100, 850)), Admit)
    assert isinstance(fleet.admit(req(10, 90)), Queue)
