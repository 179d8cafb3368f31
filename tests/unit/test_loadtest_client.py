import email.utils
import random

import pytest

from kvgate.loadtest.client import (
    RequestRecord,
    RetryPolicy,
    honours,
    parse_retry_after_s,
    retry_wait_s,
    should_retry,
)

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


def test_the_policy_is_the_sdks_own() -> None:
    """openai-python 3.63, ``_constants.py``: DEFAULT_MAX_RETRIES = 2, INITIAL_RETRY_DELAY = 0.5,
    MAX_RETRY_DELAY = 8.0, MAX_RETRY_AFTER_DELAY = 2 * 60."""
    policy = RetryPolicy()
    assert (policy.max_retries, policy.initial_backoff_s, policy.max_backoff_s) == (2, 0.5, 8.0)
    assert policy.max_header_wait_s == 120.0 and policy.give_up_past_ceiling
    legacy = RetryPolicy.legacy()
    assert legacy.max_header_wait_s == 60.0 and not legacy.give_up_past_ceiling


def test_an_unreadable_retry_after_ms_is_skipped_even_when_retry_after_is_a_date() -> None:
    date = email.utils.formatdate(NOW_S + 4, usegmt=True)
    assert parse_retry_after_s({"retry-after-ms": "soon", "retry-after": date}, NOW_S) == pytest.approx(4.0)


def test_an_overflowing_wait_counts_as_past_the_ceiling_but_a_literal_infinity_does_not() -> None:
    assert parse_retry_after_s({"retry-after": "1e999"}, NOW_S) == 121.0
    assert parse_retry_after_s({"retry-after": "inf"}, NOW_S) == float("inf")
    assert should_retry(429, {"retry-after": "inf"})
    assert not should_retry(429, {"retry-after": "1e999"})


@pytest.mark.parametrize(
    ("header_s", "expected_s"),
    [(2.0, 2.0), (0.001, 0.001), (60.0, 60.0), (120.0, 120.0)],
)
def test_server_wait_is_honoured_within_the_sdk_ceiling(header_s: float, expected_s: float) -> None:
    assert honours(RetryPolicy(), header_s)
    assert retry_wait_s(RetryPolicy(), 0, header_s, random.Random(0)) == expected_s


@pytest.mark.parametrize("header_s", [None, 0.0, -3.0, 121.0, float("inf"), float("nan")])
def test_otherwise_exponential_backoff_with_jitter(header_s: float | None) -> None:
    policy = RetryPolicy()
    assert not honours(policy, header_s)
    rng = random.Random(1)
    for retries_done, nominal_s in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (6, 8.0)]:
        wait_s = retry_wait_s(policy, retries_done, header_s, rng)
        assert 0.75 * nominal_s <= wait_s <= nominal_s


def test_which_statuses_are_retried() -> None:
    assert should_retry(429, {})
    assert should_retry(503, {})
    assert should_retry(500, {})
    assert should_retry(408, {})
    assert should_retry(409, {})
    assert should_retry(0, {})
    assert not should_retry(400, {})
    assert not should_retry(404, {})
    assert not should_retry(429, {"x-should-retry": "false"})
    assert should_retry(400, {"x-should-retry": "true"})


def test_past_the_ceiling_the_current_sdk_gives_up_and_older_ones_back_off() -> None:
    """``_should_retry`` checks the ceiling before ``x-should-retry``; before the 120 s ceiling the
    SDK retried on its own back-off whatever the server's wait."""
    far = {"retry-after": "121", "x-should-retry": "true"}
    assert not should_retry(429, far)
    assert should_retry(429, {"retry-after": "120"})
    legacy = RetryPolicy.legacy()
    assert should_retry(429, {"retry-after": "121"}, legacy)
    assert not honours(legacy, 61.0) and honours(legacy, 60.0)
    assert should_retry(429, {"retry-after-ms": "200000"}, legacy)
    assert not should_retry(429, {"retry-after-ms": "200000"})


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
