"""The prefill rate admission forecasts with is learned from the first tokens replicas deliver; with
an ITL objective, each stream's latency is learned against the sequences its replica ran."""

from __future__ import annotations

import asyncio

import pytest

from kvgate.admission.cost import CostEstimate
from kvgate.config.loader import parse_config
from kvgate.gateway.request_path.decision_path import DecisionPath
from kvgate.gateway.request_path.dispatcher import Route
from kvgate.gateway.state import GatewayState, ProxyRequest
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.routing.health import Outcome


class Clock:
    now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def routed(
    words: int, stream: bool = False, admission: dict[str, object] | None = None
) -> tuple[DecisionPath, ProxyRequest, Route, Clock, GatewayState]:
    config = parse_config(
        {
            "models": [
                {"name": "m", "max_model_len": 65536, "kv_bytes_per_token": 1, "tokenizer": {"kind": "bytes"}}
            ],
            "pools": [{"name": "p", "replicas": ["http://10.0.0.1:8000"], "kv_capacity_tokens": 100_000}],
            "admission": admission or {},
        },
        {},
    )
    clock = Clock()
    state = GatewayState.from_config(config)
    path = DecisionPath.build(state, config, GatewayMetrics(clock=clock), clock)
    for replica in state.replicas.values():
        path.fleet.observe_outcome(replica, Outcome.SUCCESS)
    body = {"model": "m", "prompt": "word " * words, "max_tokens": 8}
    request = ProxyRequest("r", "r", "/v1/completions", "m", stream, body, b"{}", [], [])

    async def admit() -> Route:
        request.arrived_s = clock()
        assert await path.pricer.price(request) is None
        route = await path.dispatcher.admit(request)
        assert isinstance(route, Route)
        return route

    return path, request, asyncio.run(admit()), clock, state


def test_a_long_prompt_first_token_teaches_the_prefill_rate() -> None:
    path, request, route, clock, _ = routed(words=4000)
    controller = path.dispatcher.controller
    assert controller.rates.prefill_tokens_per_s == 8000.0, "the configured default until observed"
    assert request.admission is not None
    prompt_tokens = request.admission.cost.prompt_tokens
    clock.now_s += 2.0
    path.accounting.first_token(request, route.replica, clock())
    sample = prompt_tokens / 2.0
    assert controller.rates.prefill_tokens_per_s == pytest.approx(8000.0 + 0.1 * (sample - 8000.0))


def test_a_short_prompt_says_nothing_about_prefill_speed() -> None:
    path, request, route, clock, _ = routed(words=20)
    clock.now_s += 0.5
    path.accounting.first_token(request, route.replica, clock())
    assert path.dispatcher.controller.rates.prefill_tokens_per_s == 8000.0


def test_a_stream_teaches_the_itl_guard_its_latency_at_the_sequences_resident_while_it_ran() -> None:
    admission = {"models": {"m": {"itl_slo_s": 0.05}}}
    path, request, route, clock, state = routed(words=20, stream=True, admission=admission)
    guard = path.dispatcher.controller.itl_guard
    assert guard is not None
    replica_id = route.replica.replica_id
    ledger = state.ledger
    request.replica = route.replica  # as the proxy sets it when it sends the request
    path.accounting.first_token(request, route.replica, clock())  # alone: 1
    for other in ("o1", "o2"):
        ledger.reserve(other, replica_id, CostEstimate("m", 10, 10, 65536), clock())
    path.accounting.produced(request, 16)  # with two others: 3
    ledger.release("o1")
    path.accounting.finished(request, route.replica, 0.02, clock())  # with one: 2
    fit = guard.fits[replica_id]
    assert (fit.observations, fit.sum_sequences, fit.sum_itl_s) == (1, pytest.approx(2.0), 0.02)
    assert guard.limits == {replica_id: 128}, "one stream is not enough to move the guard"


def test_without_an_itl_objective_nothing_is_sampled() -> None:
    path, request, route, clock, _ = routed(words=20, stream=True)
    assert path.dispatcher.controller.itl_guard is None
    request.replica = route.replica
    path.accounting.first_token(request, route.replica, clock())
    path.accounting.produced(request, 16)
    path.accounting.finished(request, route.replica, 0.02, clock())
    assert request.resident_sequences_samples == 0
