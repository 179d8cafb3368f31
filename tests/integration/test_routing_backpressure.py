"""Backpressure through the real gateway: a replica that answers 429 with ``Retry-After`` has the
request retried on another replica, is avoided for that long (the others take every request
meanwhile), is not ejected however many times it says so, and takes requests again once its window
has passed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from aiohttp import web

from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.routing.health import HealthState
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

RETRY_AFTER_S = 2
MOST_REQUESTS = 60
"""Requests sent at most while waiting for the busy replica to be picked (1 in 3 candidates)."""


@dataclass
class BusyReplica:
    url: str
    completions: int = 0


@contextlib.asynccontextmanager
async def busy_replica() -> AsyncIterator[BusyReplica]:
    """A replica whose health check passes and whose completions answer 429 with ``Retry-After``."""
    replica = BusyReplica(url="")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def complete(request: web.Request) -> web.Response:
        replica.completions += 1
        body = {"error": {"message": "busy", "type": "RateLimitError", "param": None, "code": 429}}
        return web.json_response(body, status=429, headers={"Retry-After": str(RETRY_AFTER_S)})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", complete)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    replica.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield replica
    finally:
        await runner.cleanup()


async def ask(http: httpx.AsyncClient, index: int) -> int:
    body = {"model": MODEL, "prompt": f"request {index} asks a short question", "max_tokens": 2}
    return (await http.post("/v1/completions", json=body)).status_code


async def until_picked(http: httpx.AsyncClient, busy: BusyReplica, first_index: int) -> list[int]:
    """Statuses of requests sent one at a time until the busy replica has answered one more."""
    seen = busy.completions
    statuses = []
    for index in range(first_index, first_index + MOST_REQUESTS):
        statuses.append(await ask(http, index))
        if busy.completions > seen:
            break
    return statuses


def health_state(gw: RunningGateway, url: str) -> HealthState:
    return gw.gateway.path.fleet.health.get(url).state


async def test_a_replica_answering_429_is_avoided_for_its_retry_after_not_ejected_then_used_again() -> None:
    async with (
        busy_replica() as busy,
        SimFleet(replicas=2, time_scale=0.0, seed=0, overrides={"warmup_s": 0}) as fleet,
    ):
        config = gateway_config(
            [busy.url, *fleet.urls],
            health={"interval_s": 0.1, "timeout_s": 0.5, "unhealthy_threshold": 2},
            routing={"warmup_s": 0},
        )
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            health = gw.gateway.path.fleet.health
            assert await eventually(lambda: all(r.healthy for r in gw.state.replicas.values()))
            statuses = await until_picked(http, busy, 0)
            assert busy.completions == 1, statuses
            assert set(statuses) == {200}, "the 429 is retried on another replica, not relayed"
            avoid_until_s = health.get(busy.url).avoid_until_s
            assert avoid_until_s > time.monotonic()

            during = []
            index = 1000
            while time.monotonic() < avoid_until_s - 0.2:
                during.append(await ask(http, index))
                index += 1
            assert during and set(during) == {200}, during
            assert busy.completions == 1
            assert health_state(gw, busy.url) is HealthState.HEALTHY
            assert gw.state.replicas[busy.url].healthy

            assert await eventually(lambda: time.monotonic() > avoid_until_s, timeout_s=RETRY_AFTER_S + 1)
            statuses = await until_picked(http, busy, 2000)
            assert busy.completions == 2, statuses
            assert set(statuses) == {200}, statuses
            assert health_state(gw, busy.url) is HealthState.HEALTHY
            assert health.get(busy.url).avoid_until_s > avoid_until_s
            await assert_idle(gw)
        served = [sum(r.engine.stats.request_success.values()) for r in fleet.replicas]
        assert all(count > 0 for count in served), served
