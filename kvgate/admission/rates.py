"""The service rates the admission forecasts run on, learned from what the replicas deliver.

Two measurements move them, each smoothed so one odd request does not swing every Retry-After: a
finished stream's mean inter-token gap (the decode rate), and a first token's arrival after a long
enough prompt (the prefill rate: prompt tokens over the time from leaving the queue to the first
token). The prefill sample includes the replica's own queueing, so it errs on the slow side, which
is the side a queue-wait forecast may err on; a short prompt says more about round trips than about
prefill speed and is not sampled. The configured ``default_*`` rates are only where they start.
"""

from __future__ import annotations

import dataclasses

from kvgate.admission.retry_after import ServiceRates

ITL_EWMA_WEIGHT = 0.05
PREFILL_EWMA_WEIGHT = 0.1
PREFILL_SAMPLE_MIN_TOKENS = 256


def with_stream_itl(rates: ServiceRates, itl_s: float) -> ServiceRates:
    """``rates`` after a stream whose mean inter-token gap was ``itl_s``."""
    inter_token_s = rates.inter_token_s + ITL_EWMA_WEIGHT * (itl_s - rates.inter_token_s)
    return dataclasses.replace(rates, inter_token_s=inter_token_s)


def with_first_token(rates: ServiceRates, prompt_tokens: int, served_s: float) -> ServiceRates:
    """``rates`` after a prompt of ``prompt_tokens`` got its first token ``served_s`` after it left
    the queue; unchanged when the prompt is too short or the time says nothing."""
    if prompt_tokens < PREFILL_SAMPLE_MIN_TOKENS or served_s <= 0.0:
        return rates
    sample = prompt_tokens / served_s
    per_s = rates.prefill_tokens_per_s + PREFILL_EWMA_WEIGHT * (sample - rates.prefill_tokens_per_s)
    return dataclasses.replace(rates, prefill_tokens_per_s=per_s)
