"""Routing at the edge against the simulator: a replica killed mid-run costs the clients nothing
that had not started, ends the streams it held with an error event and ``[DONE]``, and is ejected;
a paused replica is ejected by its probes and re-admitted once it answers again."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.routing.health import HealthState
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config
from tests.integration.test_gateway_errors import failing_replica

FAST_HEALTH = {"interval_s": 0.1, "timeout_s": 0.2}
FAST_EJECTION = {"warmup_s": 0, "ejection_backoff_base_s": 0.5, "ejection_backoff_max_s": 1.0}


def fleet_of_two(time_scale: float) -> SimFleet:
    return SimFleet(replicas=2, time_scale=time_scale, seed=0, overrides={"warmup_s": 0})


def config_for(fleet: SimFleet) -> Any:
    return gateway_config(fleet.urls, health=FAST_HEALTH, routing=FAST_EJECTION)


def health_of(gw: RunningGateway, url: str) -> HealthState:
    return gw.gateway.path.fleet.health.get(url).state


async def stream(http: httpx.AsyncClient, request_id: str, started: asyncio.Event) -> bytes:
    body = {
        "model": MODEL,
        "prompt": f"story {request_id}",
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    received = bytearray()
    async with http.stream(
        "POST", "/v1/completions", json=body, headers={"x-request-id": request_id}
    ) as response:
        assert response.status_code == 200
        async for raw in response.aiter_raw():
            received += raw
            started.set()
    return bytes(received)


async def short(http: httpx.AsyncClient, i: int) -> httpx.Response:
    prompt = f"question number {i}: " + "how does a gateway route requests to replicas? " * 4
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
    return await http.post("/v1/completions", json=body)


async def test_a_killed_replica_ends_its_streams_cleanly_others_go_elsewhere_and_it_is_ejected() -> None:
    async with fleet_of_two(time_scale=1.0) as fleet, running_gateway(config_for(fleet)) as gw:
        dead = fleet.urls[0]
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            events = [asyncio.Event() for _ in range(6)]
            streams = [asyncio.create_task(stream(http, f"s{i}", events[i])) for i in range(6)]
            await asyncio.gather(*(e.wait() for e in events))
            on_dead = {
                request.x_request_id
                for request in gw.gateway.path.dispatcher.leases.requests()
                if request.replica is not None and request.replica.replica_id == dead
            }
            assert on_dead, "the least-load policy spreads six streams over both replicas"
            await fleet.kill(0)
            answers = await asyncio.gather(*(short(http, i) for i in range(8)))
            assert [a.status_code for a in answers] == [200] * 8
            bodies = dict(zip((f"s{i}" for i in range(6)), await asyncio.gather(*streams), strict=True))
        for request_id, body in bodies.items():
            assert body.endswith(b"data: [DONE]\n\n")
            assert body.count(b"[DONE]") == 1
            assert (b'data: {"error":' in body) == (request_id in on_dead), request_id
        assert await eventually(lambda: health_of(gw, dead) is HealthState.EJECTED)
        await assert_idle(gw)


async def test_a_paused_replica_is_ejected_by_its_probes_and_readmitted_when_it_answers() -> None:
    async with fleet_of_two(time_scale=0.0) as fleet, running_gateway(config_for(fleet)) as gw:
        paused = fleet.urls[0]
        await fleet.pause(0)
        assert await eventually(lambda: health_of(gw, paused) is HealthState.EJECTED)
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            answers = await asyncio.gather(*(short(http, i) for i in range(8)))
            assert [a.status_code for a in answers] == [200] * 8
            assert sum(fleet.replicas[0].engine.stats.request_success.values()) == 0
            await fleet.resume(0)
            assert await eventually(lambda: health_of(gw, paused) is HealthState.HEALTHY)
            answers = await asyncio.gather(*(short(http, 100 + i) for i in range(16)))
            assert [a.status_code for a in answers] == [200] * 16
        assert sum(fleet.replicas[0].engine.stats.request_success.values()) > 0
        await assert_idle(gw)


async def test_a_replica_removed_from_its_pool_is_forgotten_by_routing_and_health() -> None:
    async with fleet_of_two(time_scale=0.0) as fleet, running_gateway(config_for(fleet)) as gw:
        gone, kept = fleet.urls
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            answers = await asyncio.gather(*(short(http, i) for i in range(8)))
            assert [a.status_code for a in answers] == [200] * 8
            index = gw.gateway.path.dispatcher.router.prefix_index
            assert index.size_blocks(gone) > 0 and health_of(gw, gone) is HealthState.HEALTHY
            gw.state.set_pool_urls("default", [kept])
            assert index.size_blocks(gone) == 0
            assert health_of(gw, gone) is HealthState.STARTING
            served_before = sum(fleet.replicas[0].engine.stats.request_success.values())
            answers = await asyncio.gather(*(short(http, 100 + i) for i in range(8)))
            assert [a.status_code for a in answers] == [200] * 8
        assert sum(fleet.replicas[0].engine.stats.request_success.values()) == served_before
        await assert_idle(gw)


async def test_a_replica_answering_500_is_retried_around_and_ejected_by_passive_health() -> None:
    async with (
        failing_replica(500) as broken,
        SimFleet(replicas=1, time_scale=0.0, seed=0) as fleet,
        running_gateway(gateway_config([broken, *fleet.urls], health={"interval_s": 5.0})) as gw,
        httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
    ):
        answers = [await short(http, i) for i in range(8)]
        assert [a.status_code for a in answers] == [200] * 8
        assert health_of(gw, broken) is HealthState.EJECTED
        await assert_idle(gw)
