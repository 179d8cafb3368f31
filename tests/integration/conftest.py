"""Shared set-up for integration tests: a simulated fleet, a gateway config pointing at it, and the
end-of-test invariant that the gateway holds nothing for finished requests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from kvgate.config.gateway import GatewayConfig
from kvgate.config.loader import parse_config
from kvgate.gateway.edge.server import RunningGateway
from kvgate.sim.fleet import DEFAULT_MODEL, SimFleet
from kvgate.vocabulary.replica import ReplicaLoad

MODEL = DEFAULT_MODEL


def gateway_config(urls: Sequence[str], **sections: Any) -> GatewayConfig:
    """A config for ``urls`` with fast health probes; ``sections`` are merged over the defaults
    (e.g. ``server={"max_body_bytes": 1000}``)."""
    data: dict[str, Any] = {
        "server": {"port": 0},
        "health": {"interval_s": 0.2, "timeout_s": 1.0},
        "models": [{"name": MODEL, "max_model_len": 131072, "kv_bytes_per_token": 131072}],
        "pools": [{"name": "default", "replicas": list(urls), "kv_capacity_tokens": 450000}],
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_config(data, {}, "<test>", _no_old_key)


def _no_old_key(warning: str) -> None:
    """The tests speak the current keys; the old ones have their own (``test_config_renames``)."""
    raise AssertionError(warning)


async def eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll ``condition`` until it holds or ``timeout_s`` passes; returns its last value."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not condition() and loop.time() < end:
        await asyncio.sleep(0.01)
    return condition()


async def assert_idle(gw: RunningGateway) -> None:
    """Every request finished and released: nothing in flight, reserved or queued anywhere."""
    assert await eventually(lambda: gw.state.in_flight == 0), gw.state.in_flight
    assert all(count == 0 for count in gw.state.in_flight_by_replica().values()), (
        gw.state.in_flight_by_replica()
    )
    assert await eventually(lambda: gw.state.ledger.totals() == ReplicaLoad()), gw.state.ledger.totals()
    assert gw.state.queued == 0
    controller = gw.gateway.path.dispatcher.controller
    assert controller.queue_stats(0.0).requests == 0
    an_hour_on_s = time.monotonic() + 3600.0
    assert controller.queue_stats(an_hour_on_s).promised_requests == 0, "every Retry-After promise lapses"


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    """Two replicas, instant simulated time, every response recorded."""
    async with SimFleet(replicas=2, time_scale=0.0, record_streams=True, seed=0) as sim:
        yield sim
