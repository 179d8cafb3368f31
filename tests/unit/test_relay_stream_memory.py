"""What an open stream holds in the gateway grows by at most a packed double per token: its
inter-token gaps, kept until it ends (``relay._StreamCount``, which every relayed chunk passes
through, on the task's path and the edge's alike), never a Python object per token.

Measured as traced memory held, whichever frame allocated it, so the check means the same for the
interpreted sources and the compiled build (where no allocation has a Python frame of its own)."""

from __future__ import annotations

import asyncio
import tracemalloc

from kvgate.config.loader import parse_config
from kvgate.gateway.request_path.decision_path import DecisionPath
from kvgate.gateway.request_path.dispatcher import Route
from kvgate.gateway.request_path.relay import _StreamCount
from kvgate.gateway.state import GatewayState, ProxyRequest
from kvgate.gateway.telemetry.metrics import GatewayMetrics
from kvgate.routing.health import Outcome

TOKENS = 3000
EVENT = b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" x"}]}\n\n'


def routed_stream() -> tuple[ProxyRequest, Route, DecisionPath]:
    config = parse_config(
        {
            "models": [
                {"name": "m", "max_model_len": 8192, "kv_bytes_per_token": 1, "tokenizer": {"kind": "bytes"}}
            ],
            "pools": [{"name": "p", "replicas": ["http://10.0.0.1:8000"], "kv_capacity_tokens": 8000}],
        },
        {},
    )
    state = GatewayState.from_config(config)
    path = DecisionPath.build(state, config, GatewayMetrics())
    for replica in state.replicas.values():
        path.fleet.observe_outcome(replica, Outcome.SUCCESS)  # its first probe answered
    body = {"model": "m", "prompt": "hello there", "max_tokens": TOKENS, "stream": True}
    request = ProxyRequest("r", "r", "/v1/completions", "m", True, body, b"{}", [], [])

    async def decide() -> Route:
        assert await path.pricer.price(request) is None
        route = await path.dispatcher.admit(request)
        assert isinstance(route, Route), route
        return route

    return request, asyncio.run(decide()), path


def test_a_long_stream_holds_eight_bytes_a_token_for_its_gaps() -> None:
    request, route, path = routed_stream()
    count = _StreamCount(request, route.replica, path.accounting, lambda: 0.0)
    assert count.take(EVENT, 0.0) == EVENT
    tracemalloc.start()
    try:
        before_bytes = tracemalloc.get_traced_memory()[0]
        for token in range(1, TOKENS):
            count.take(EVENT, token * 0.001)
        held_bytes = tracemalloc.get_traced_memory()[0] - before_bytes
    finally:
        tracemalloc.stop()
    assert count.events == TOKENS and len(count.gaps_s) == TOKENS - 1
    assert count.gaps_s.itemsize == 8
    assert held_bytes < 12 * TOKENS, f"{held_bytes / TOKENS:.1f} bytes a token"
    path.dispatcher.release(request)
