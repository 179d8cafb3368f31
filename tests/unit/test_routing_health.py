from __future__ import annotations

import pytest

from kvgate.routing.health import (
    HealthRules,
    HealthState,
    HealthTracker,
    Outcome,
    ReplicaHealth,
    outcome_of_status,
)

RULES = HealthRules(
    unhealthy_threshold=3,
    healthy_threshold=2,
    ejection_backoff_base_s=5.0,
    ejection_backoff_max_s=40.0,
    backpressure_avoid_s=1.0,
    backpressure_avoid_max_s=10.0,
)
S, F, B = Outcome.SUCCESS, Outcome.FAILURE, Outcome.BACKPRESSURE


def run(outcomes: list[tuple[float, Outcome]], health: ReplicaHealth | None = None) -> ReplicaHealth:
    health = health or ReplicaHealth()
    for now_s, outcome in outcomes:
        health = health.observe(outcome, now_s, RULES)
    return health


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(None, F), (200, S), (400, S), (404, S), (429, B), (503, B), (500, F), (502, F), (504, F)],
)
def test_outcome_of_status(status: int | None, outcome: Outcome) -> None:
    assert outcome_of_status(status) is outcome


def test_never_routable_before_reporting_healthy() -> None:
    assert not ReplicaHealth().routable(0.0)
    after_one = run([(1.0, S)])
    assert after_one.state is HealthState.STARTING and not after_one.routable(1.0)
    healthy = run([(1.0, S), (2.0, S)])
    assert healthy.state is HealthState.HEALTHY and healthy.routable(2.0) and healthy.ready_since_s == 2.0
    assert run([(1.0, S), (2.0, F), (3.0, S)]).state is HealthState.STARTING


def test_consecutive_failures_eject_with_exponential_backoff_capped() -> None:
    healthy = run([(0.0, S), (0.0, S)])
    assert run([(1.0, F), (2.0, F), (3.0, S), (4.0, F)], healthy).state is HealthState.HEALTHY
    ejected = run([(1.0, F), (2.0, F), (3.0, F)], healthy)
    assert ejected.state is HealthState.EJECTED and ejected.ejected_until_s == 8.0
    assert not ejected.routable(7.9) and not ejected.routable(8.0)
    assert run([(5.0, S), (6.0, S), (7.0, F)], ejected) == ejected
    until = []
    health = ejected
    for _ in range(5):
        now_s = health.ejected_until_s
        health = health.observe(F, now_s, RULES)
        until.append(health.ejected_until_s - now_s)
    assert until == [10.0, 20.0, 40.0, 40.0, 40.0]


def test_returning_replica_is_fresh_and_loses_its_streak_after_staying_healthy() -> None:
    ejected = run([(0.0, S), (0.0, S), (1.0, F), (2.0, F), (3.0, F)])
    back = run([(9.0, S), (10.0, S)], ejected)
    assert back.state is HealthState.HEALTHY and back.ready_since_s == 10.0 and back.ejections == 1
    assert run([(49.0, S)], back).ejections == 1
    assert run([(50.0, S)], back).ejections == 0


def test_after_its_back_off_an_ejected_replica_gets_no_traffic_until_its_probes_succeed() -> None:
    ejected = run([(0.0, S), (0.0, S), (1.0, F), (2.0, F), (3.0, F)])
    assert not ejected.routable(100.0)
    half_way = run([(9.0, S)], ejected)
    assert half_way.state is HealthState.EJECTED and not half_way.routable(9.0)
    assert run([(9.5, S)], half_way).routable(9.5)
    again = run([(9.5, F)], half_way)
    assert again.state is HealthState.EJECTED and again.ejected_until_s == 19.5


def test_backpressure_avoids_briefly_without_ejecting() -> None:
    healthy = run([(0.0, S), (0.0, S)])
    pushed = healthy
    for now_s in (1.0, 1.1, 1.2, 1.3, 1.4):
        pushed = pushed.observe(B, now_s, RULES)
    assert pushed.state is HealthState.HEALTHY and pushed.consecutive_failures == 0
    assert pushed.avoid_until_s == pytest.approx(2.4)
    assert healthy.observe(B, 1.0, RULES, retry_after_s=3.0).avoid_until_s == 4.0
    assert healthy.observe(B, 1.0, RULES, retry_after_s=300.0).avoid_until_s == 11.0


def test_view_fields_follow_the_health_state_through_ejection_and_probation() -> None:
    tracker = HealthTracker(RULES)
    for now_s, outcome in [(0.0, S), (0.5, S)]:
        tracker.observe("a", outcome, now_s)
    assert tracker.get("a").view_fields(1.0) == (True, 0.5, 0.0)
    for now_s in (2.0, 3.0, 4.0):
        tracker.observe("a", F, now_s)
    assert tracker.get("a").view_fields(5.0) == (False, None, 9.0)
    assert tracker.get("a").view_fields(9.0) == (False, None, 9.0)
    for now_s in (9.0, 9.5):
        tracker.observe("a", S, now_s)
    assert tracker.get("a").view_fields(10.0) == (True, 9.5, 9.0)
    tracker.remove("a")
    assert tracker.get("a") == ReplicaHealth()
