from __future__ import annotations

from kvgate.config.routing import RoutingConfig
from kvgate.routing.retry_budget import RetryBudget


def test_retry_only_before_first_byte_and_within_max_retries() -> None:
    budget = RetryBudget(ratio=1.0, floor=10, window_s=10.0, max_retries=2)
    assert budget.allow(0.0, retries_so_far=0, first_byte_sent=True).reason == "first_byte_sent"
    assert budget.allow(0.0, retries_so_far=2, first_byte_sent=False).reason == "max_retries"
    verdict = budget.allow(0.0, retries_so_far=1, first_byte_sent=False)
    assert verdict.allowed and verdict.reason == "retry"


def test_budget_is_a_fraction_of_recent_requests_plus_a_floor() -> None:
    budget = RetryBudget(ratio=0.2, floor=2, window_s=10.0, max_retries=5)
    for i in range(50):
        budget.record_request(i * 0.1)
    allowed = sum(budget.allow(5.0, 0, False).allowed for _ in range(40))
    assert allowed == 12
    assert budget.window_counts(5.0) == (50, 12)
    assert not budget.allow(5.0, 0, False).allowed
    assert budget.allow(15.5, 0, False).allowed
    assert budget.window_counts(15.5) == (0, 1)


def test_quiet_gateway_still_gets_the_floor() -> None:
    budget = RetryBudget.from_config(RoutingConfig(retry_budget_floor=3, retry_budget_ratio=0.0))
    assert [budget.allow(0.0, 0, False).allowed for _ in range(4)] == [True, True, True, False]


def test_requests_without_retries_keep_only_one_window_of_stamps() -> None:
    budget = RetryBudget(ratio=0.2, floor=2, window_s=10.0, max_retries=2)
    for i in range(10_000):
        budget.record_request(i * 0.1)
    assert len(budget._requests_s) == 100
    assert budget.window_counts(999.9) == (100, 0)
