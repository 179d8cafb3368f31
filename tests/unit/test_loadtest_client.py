import email.utils
import random

import pytest

from kvgate.loadtest.client import RequestRecord, RetryPolicy, parse_retry_after_s, retry_wait_s, should_retry

NOW_S = 1_700_000_000.0


def test_retry_after_ms_wins_over_retry_after() -> None:
    assert parse_retry_after_s({"retry-after-ms": "1500", "retry-after": "9"}, NOW_S) == 1.5


def test_retry_after_seconds() -> None:
    assert parse_retry_after_s({"retry-after": "3"}, NOW_S) == 3.0
    assert parse_retry_after_s({"retry-after": "0.25"}, NOW_S) == 0.25


def test_bad_retry_after_ms_falls_back_to_retry_after() -> None:
    assert parse_retry_after_s({"retry-after-ms": "soon", "retry-after": "2"}, NOW_S) == 2.0


def test_retry_after_http_date_is_relative_to_now() -> None:
    date = email.utils.formatdate(NOW_S + 7, usegmt=True)
    assert parse_retry_after_s({"retry-after": date}, NOW_S) == pytest.approx(7.0)


def test_missing_or_garbage_retry_after_is_none() -> None:
    assert parse_retry_after_s({}, NOW_S) is None
    assert parse_retry_after_s({"retry-after": "whenever"}, NOW_S) is None


@pytest.mark.parametrize(
    ("header_s", "expected_s"),
    [(2.0, 2.0), (60.0, 60.0)],
)
def test_server_wait_is_honoured_within_the_sdk_bound(header_s: float, expected_s: float) -> None:
    assert retry_wait_s(RetryPolicy(), 0, header_s, random.Random(0)) == expected_s


@pytest.mark.parametrize("header_s", [None, 0.0, -3.0, 61.0])
def test_otherwise_exponential_backoff_with_jitter(header_s: float | None) -> None:
    policy = RetryPolicy(initial_backoff_s=0.5, max_backoff_s=8.0)
    rng = random.Random(1)
    for retries_done, nominal_s in [(0, 0.5), (1, 1.0), (2, 2.0), (6, 8.0)]:
        wait_s = retry_wait_s(policy, retries_done, header_s, rng)
        assert 0.75 * nominal_s <= wait_s <= nominal_s


def test_which_statuses_are_retried() -> None:
    assert should_retry(429, {})
    assert should_retry(503, {})
    assert should_retry(408, {})
    assert not should_retry(400, {})
    assert not should_retry(429, {"x-should-retry": "false"})
    assert should_retry(400, {"x-should-retry": "true"})


def _record(**changes: object) -> RequestRecord:
    values: dict[str, object] = {
        "index": 0,
        "class_name": "c",
        "scheduled_at_s": 1.0,
        "sent_at_s": 1.01,
        "status": 200,
        "error": None,
        "ttft_s": 0.5,
        "itl_s": (0.02, 0.04),
        "e2e_s": 1.0,
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "retries": 0,
        "wait_honoured_s": 0.0,
    }
    values.update(changes)
    return RequestRecord(**values)  # type: ignore[arg-type]


def test_goodput_needs_both_slos_and_success() -> None:
    assert _record().meets_slo(ttft_s=1.0, itl_s=0.05)
    assert not _record(ttft_s=1.5).meets_slo(ttft_s=1.0, itl_s=0.05)
    assert not _record(itl_s=(0.02, 0.1)).meets_slo(ttft_s=1.0, itl_s=0.05)
    assert not _record(status=429, ttft_s=None).meets_slo(ttft_s=1.0, itl_s=0.05)
    assert not _record(error="stream broke").meets_slo(ttft_s=1.0, itl_s=0.05)
    assert _record(itl_s=()).meets_slo(ttft_s=1.0, itl_s=0.05)


def test_lag_is_send_minus_schedule() -> None:
    assert _record().lag_s == pytest.approx(0.01)
    assert _record(scheduled_at_s=None).lag_s is None
    assert _record(status=429).rejected
