"""The sim actuator against real parts: a simulated fleet with a control port, a gateway in front of
it with an admin token, and ``SimActuator`` resizing both. Growing adds a replica that the gateway
routes to only after its cold start; shrinking takes it out of the gateway before it drains, so the
requests it is serving finish and no client sees an error."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import httpx

from kvgate.autoscaler.actuators import SimActuator
from kvgate.autoscaler.recommendation import Recommendation
from kvgate.gateway.edge.server import RunningGateway, running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config

TOKEN = "scale-token"
COLD_START_S = 0.5


def recommend(replicas: int) -> Recommendation:
    reason = "scale_out_occupancy_ttft" if replicas > 1 else "scale_in_idle"
    return Recommendation(pool="default", desired_replicas=replicas, reason=reason)


def healthy(gw: RunningGateway, url: str) -> bool:
    replica = gw.state.replicas.get(url)
    return replica is not None and replica.healthy


async def complete(http: httpx.AsyncClient, request_id: str) -> httpx.Response:
    body = {"model": MODEL, "prompt": "Say hi", "max_tokens": 2}
    return await http.post("/v1/completions", json=body, headers={"x-request-id": request_id})


async def stream_story(http: httpx.AsyncClient, request_id: str) -> bytes:
    body = {"model": MODEL, "prompt": "A long story", "max_tokens": 150, "stream": True, "ignore_eos": True}
    async with http.stream(
        "POST", "/v1/completions", json=body, headers={"x-request-id": request_id}
    ) as response:
        assert response.status_code == 200
        return b"".join([chunk async for chunk in response.aiter_raw()])


async def test_grow_adds_a_cold_replica_that_serves_after_start_and_shrink_drops_it_cleanly() -> None:
    async with (
        SimFleet(
            replicas=1, time_scale=1.0, cold_start_s=0.0, record_streams=True, seed=0, control_port=0
        ) as fleet,
    ):
        config = gateway_config(fleet.urls, auth={"admin_token": TOKEN}, routing={"warmup_s": 0.5})
        async with (
            running_gateway(config) as gw,
            httpx.AsyncClient(base_url=gw.url, timeout=60.0) as http,
            aiohttp.ClientSession() as session,
        ):
            assert fleet.control_url is not None
            actuator = SimActuator(
                session,
                {"default": fleet.control_url},
                cold_start_s=COLD_START_S,
                gateway_url=gw.url,
                admin_token=TOKEN,
            )
            await actuator.apply(recommend(2))
            assert len(fleet.replicas) == 2
            added = fleet.replicas[1]
            assert sorted(gw.state.replicas) == sorted(fleet.urls)
            assert added.state == "starting" and not healthy(gw, added.url)
            for i in range(3):
                assert (await complete(http, f"cold-{i}")).status_code == 200
                assert not added.recorded(f"cold-{i}")

            await added.wait_ready()
            assert await eventually(lambda: healthy(gw, added.url))
            served_by_added = 0
            for i in range(60):
                assert (await complete(http, f"warm-{i}")).status_code == 200
                served_by_added += bool(added.recorded(f"warm-{i}"))
                if served_by_added >= 2:
                    break
            assert served_by_added >= 2

            await actuator.apply(recommend(2))
            assert len(fleet.replicas) == 2

            streams = [asyncio.create_task(stream_story(http, f"story-{i}")) for i in range(6)]
            assert await eventually(lambda: gw.state.in_flight_by_replica().get(added.url, 0) > 0)
            await actuator.apply(recommend(1))
            assert list(gw.state.replicas) == [fleet.urls[0]]
            assert added.state == "removed"
            bodies = await asyncio.gather(*streams)
            for body in bodies:
                assert body.endswith(b"data: [DONE]\n\n") and b'"finish_reason":"length"' in body
            assert any(added.recorded(f"story-{i}") for i in range(6))
            for i in range(3):
                assert (await complete(http, f"after-{i}")).status_code == 200
                assert fleet.replicas[0].recorded(f"after-{i}")
            await assert_idle(gw)


async def test_without_the_token_the_gateway_refuses_the_new_replica_set() -> None:
    async with SimFleet(replicas=1, time_scale=0.0, seed=0, control_port=0) as fleet:
        config = gateway_config(fleet.urls, auth={"admin_token": TOKEN})
        async with running_gateway(config) as gw, aiohttp.ClientSession() as session:
            assert fleet.control_url is not None
            actuator = SimActuator(session, {"default": fleet.control_url}, gateway_url=gw.url)
            try:
                await actuator.apply(recommend(2))
            except aiohttp.ClientResponseError as exc:
                assert exc.status == 401
            else:
                raise AssertionError("the gateway accepted a replica set without the admin token")
            assert list(gw.state.replicas) == [fleet.urls[0]]


async def test_the_autoscaler_section_sets_the_signals_window_and_the_gateway_publishes_its_answer() -> None:
    autoscaler = {"interval_s": 0.1, "signals_window_s": 12.0, "policy": {"min_replicas": 3}}
    async with SimFleet(replicas=1, time_scale=0.0, seed=0) as fleet:
        config = gateway_config(fleet.urls, autoscaler=autoscaler)
        async with running_gateway(config) as gw, httpx.AsyncClient(base_url=gw.url) as http:
            doc: dict[str, Any] = (await http.get("/signals")).json()
            assert doc["window_s"] == 12.0
            for _ in range(100):
                pool: dict[str, Any] = (await http.get("/signals")).json()["pools"]["default"]
                if pool["desired_replicas"] is not None:
                    break
                await asyncio.sleep(0.05)
            assert (pool["desired_replicas"], pool["desired_reason"]) == (3, "min_replicas")
