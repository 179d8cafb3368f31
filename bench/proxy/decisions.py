"""The decision path alone, in this process (``--decisions N``): price, admit, first token,
``finished`` and ``release`` for N requests against four healthy replicas, no sockets; and one
request as ``Proxy._done`` receives it, for the access-log and tracing parts (``bench.proxy.record``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import TYPE_CHECKING

import aiohttp

from bench.proxy.stage import CHAT_PATH, CHUNKS, MODEL, NON_STREAM_BODY, NON_STREAM_REQUEST, config

if TYPE_CHECKING:
    from kvgate.gateway.request_path.decision_path import DecisionPath
    from kvgate.gateway.request_path.dispatcher import Route
    from kvgate.gateway.request_path.pricing import Uncounted
    from kvgate.gateway.state import ProxyRequest


def _ready_path() -> DecisionPath:
    """The gateway's decision path over four healthy replicas, without a gateway around it."""
    from kvgate.config.loader import parse_config
    from kvgate.gateway.request_path.decision_path import DecisionPath
    from kvgate.gateway.state import GatewayState
    from kvgate.gateway.telemetry.metrics import GatewayMetrics
    from kvgate.routing.health import Outcome

    state_config = parse_config(config(range(9000, 9004), 0), {})
    state = GatewayState.from_config(state_config)
    path = DecisionPath.build(state, state_config, GatewayMetrics())
    for replica in state.replicas.values():
        path.fleet.observe_outcome(replica, Outcome.SUCCESS)
    return path


async def _admitted(path: DecisionPath, request: ProxyRequest) -> Route:
    """``request`` priced, admitted and routed, as ``Proxy._serve`` does before relaying it."""
    route_type, uncounted_type = _decision_types()
    request.arrived_s = path.clock()
    refusal = path.pricer.price_now(request)
    if isinstance(refusal, uncounted_type):
        refusal = await path.pricer.count(request, refusal)
    route = refusal if refusal is not None else path.dispatcher.admit_now(request)
    if asyncio.iscoroutine(route):
        route = await route
    assert isinstance(route, route_type), route
    return route


@functools.cache
def _decision_types() -> tuple[type[Route], type[Uncounted]]:
    """Imported once, not per timed request: an import statement costs ~0.7 µs even of a module
    already loaded, a few per cent of the decision path."""
    from kvgate.gateway.request_path.dispatcher import Route
    from kvgate.gateway.request_path.pricing import Uncounted

    return Route, Uncounted


def _answered(path: DecisionPath, request: ProxyRequest, route: Route) -> None:
    """The rest of a 200 answer's life: first token, usage, finished, closed, released."""
    now_s = path.clock()
    path.accounting.first_token(request, route.replica, now_s)
    request.prompt_tokens, request.completion_tokens = 8, CHUNKS
    path.accounting.finished(request, route.replica, None, now_s)
    path.accounting.closed(request, route.replica)
    path.dispatcher.release(request)


def _request(request_id: str) -> ProxyRequest:
    from kvgate.gateway.state import ProxyRequest

    return ProxyRequest(
        request_id, request_id, CHAT_PATH, MODEL, False, NON_STREAM_REQUEST, NON_STREAM_BODY, [], []
    )


async def answered_request() -> ProxyRequest:
    """One request as ``Proxy._done`` receives it: priced, admitted, sent, answered 200 with usage,
    released."""
    path = _ready_path()
    request = _request("0")
    async with aiohttp.ClientSession() as session:
        path.pricer.session = session
        route = await _admitted(path, request)
    request.replica, request.started_s, request.status = route.replica, request.arrived_s, 200
    _answered(path, request, route)
    return request


async def time_decisions(total: int, held: int = 32) -> float:
    """CPU microseconds per request of the decision path alone, ``held`` requests in flight."""
    path = _ready_path()
    in_flight: list[tuple[ProxyRequest, Route]] = []
    async with aiohttp.ClientSession() as session:
        path.pricer.session = session
        start_s = time.process_time()
        for i in range(total):
            request = _request(str(i))
            in_flight.append((request, await _admitted(path, request)))
            if len(in_flight) > held:
                _answered(path, *in_flight.pop(0))
        return (time.process_time() - start_s) / total * 1e6
