"""The forecasts' rates move with what replicas deliver, smoothed, and only on telling samples."""

from __future__ import annotations

import pytest

from kvgate.admission.rates import PREFILL_SAMPLE_MIN_TOKENS, with_first_token, with_stream_itl
from kvgate.admission.retry_after import ServiceRates

START = ServiceRates(inter_token_s=0.03, prefill_tokens_per_s=8000.0)


def test_a_long_prompt_moves_the_prefill_rate_a_tenth_of_the_way() -> None:
    learned = with_first_token(START, 4000, 2.0)
    assert learned.prefill_tokens_per_s == pytest.approx(8000.0 + 0.1 * (2000.0 - 8000.0))
    assert learned.inter_token_s == START.inter_token_s


@pytest.mark.parametrize(("prompt_tokens", "served_s"), [(PREFILL_SAMPLE_MIN_TOKENS - 1, 0.5), (4000, 0.0)])
def test_a_short_prompt_or_an_empty_time_teaches_nothing(prompt_tokens: int, served_s: float) -> None:
    assert with_first_token(START, prompt_tokens, served_s) == START


def test_a_stream_moves_the_inter_token_latency_a_twentieth_of_the_way() -> None:
    learned = with_stream_itl(START, 0.05)
    assert learned.inter_token_s == pytest.approx(0.03 + 0.05 * 0.02)
    assert learned.prefill_tokens_per_s == START.prefill_tokens_per_s
