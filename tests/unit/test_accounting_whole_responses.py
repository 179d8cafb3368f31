"""A whole (non-streamed) response arrives when its generation has ended: its arrival is no first
token, so neither the prefill rate, nor the replica's TTFT average, nor the TTFT metrics learn from
it; a stream's first token still teaches all three."""

from __future__ import annotations

import re

import pytest

from tests.unit.test_accounting import routed


def ttft_count(exposition: str) -> float:
    counts = re.findall(r"^kvgate_time_to_first_token_seconds_count\{[^}]*\} (\S+)$", exposition, re.M)
    return sum(float(c) for c in counts)


@pytest.mark.parametrize("stream", [False, True])
def test_only_a_streams_first_token_teaches_prefill_rate_replica_ttft_and_metrics(stream: bool) -> None:
    path, request, route, clock, _ = routed(words=4000, stream=stream)
    controller = path.dispatcher.controller
    replica = route.replica
    default_rate = controller.rates.prefill_tokens_per_s
    request.replica = replica
    clock.now_s += 20.0  # a whole generation's time, as a non-streamed answer arrives
    path.accounting.first_token(request, replica, clock())
    path.accounting.finished(request, replica, None, clock())
    exposition = path.metrics.render().decode()
    if stream:
        assert controller.rates.prefill_tokens_per_s < default_rate
        assert replica.ttft_ewma_s == pytest.approx(20.0)
    else:
        assert controller.rates.prefill_tokens_per_s == default_rate, "a generation is no prefill"
        assert replica.ttft_ewma_s is None, "a whole response does not make a replica look cold"
    assert request.first_token_s == clock(), "the access log still says when the answer came"
    assert ttft_count(exposition) == (1.0 if stream else 0.0)
