"""The prefill rate admission forecasts with is learned from the first tokens replicas deliver."""

from __future__ import annotations

import asyncio

import pytest

from config.loader import parse_config
from gateway.decision_path import DecisionPath
from gateway.dispatcher import Route
from gateway.metrics import GatewayMetrics
from gateway.state import GatewayState, ProxyRequest
from routing.health import Outcome


class Clock:
    now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def routed(words: int) -> tuple[DecisionPath, ProxyRequest, Route, Clock]:
    config = parse_config(
        {
            "models": [
                {"name": "m", "max_model_len": 65536, "kv_bytes_per_token": 1, "tokenizer": {"kind": "bytes"}}
            ],
            "pools": [{"name": "p", "replicas": ["http://10.0.0.1:8000"], "kv_capacity_tokens": 100_000}],
        },
        {},
    )
    clock = Clock()
    state = GatewayState.from_config(config)
    path = DecisionPath.build(state, config, GatewayMetrics(clock=clock), clock)
    for replica in state.replicas.values():
        path.fleet.observe_outcome(replica, Outcome.SUCCESS)
    body = {"model": "m", "prompt": "word " * words, "max_tokens": 8}
    request = ProxyRequest("r", "r", "/v1/completions", "m", False, body, b"{}", [], [])

    async def admit() -> Route:
        request.arrived_s = clock()
        assert await path.pricer.price(request) is None
        route = await path.dispatcher.admit(request)
        assert isinstance(route, Route)
        return route

    return path, request, asyncio.run(admit()), clock


def test_a_long_prompt_first_token_teaches_the_prefill_rate() -> None:
    path, request, route, clock = routed(words=4000)
    controller = path.dispatcher.controller
    assert controller.rates.prefill_tokens_per_s == 8000.0, "the configured default until observed"
    assert request.admission is not None
    prompt_tokens = request.admission.cost.prompt_tokens
    clock.now_s += 2.0
    path.accounting.first_token(request, route.replica, clock())
    sample = prompt_tokens / 2.0
    assert controller.rates.prefill_tokens_per_s == pytest.approx(8000.0 + 0.1 * (sample - 8000.0))


def test_a_short_prompt_says_nothing_about_prefill_speed() -> None:
    path, request, route, clock = routed(words=20)
    clock.now_s += 0.5
    path.accounting.first_token(request, route.replica, clock())
    assert path.dispatcher.controller.rates.prefill_tokens_per_s == 8000.0
