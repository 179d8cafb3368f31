"""A closed-loop scale-in under streaming load ends no stream early: ``kvgate autoscale``'s loop
(real signals from a real gateway, the real policy) with the Kubernetes actuator, in front of a
simulated fleet behind a stand-in Kubernetes API on loopback (``kubernetes_fleet``). The gateway
finds the replicas through the fleet's EndpointSlices; the actuator picks the pods with the least
work in flight, takes them out of routing, waits for their streams, marks them first to go and only
then lowers the scale, which the stand-in's ReplicaSet carries out on the chosen pods. Its pods get a
grace period shorter than a stream: the same scale-in without the drain cuts streams."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
from kubernetes import client

from kvgate.autoscaler.actuators import KubernetesActuator
from kvgate.autoscaler.loop import GatewaySources, run_loop
from kvgate.config.autoscaler import AutoscalerConfig
from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config
from tests.integration.kubernetes_api import TOKEN as API_TOKEN
from tests.integration.kubernetes_fleet import COST, ROUTABLE, FleetCluster, fleet_api

ADMIN_TOKEN = "scale-in-token"
STREAM_TOKENS = 120
CLIENTS = 6


async def stream(http: httpx.AsyncClient, request_id: str) -> bytes:
    body = {
        "model": MODEL,
        "prompt": "A long story",
        "max_tokens": STREAM_TOKENS,
        "stream": True,
        "ignore_eos": True,
    }
    async with http.stream(
        "POST", "/v1/completions", json=body, headers={"x-request-id": request_id}
    ) as response:
        if response.status_code != 200:
            return b"status %d" % response.status_code
        return b"".join([chunk async for chunk in response.aiter_raw()])


def whole(body: bytes) -> bool:
    return (
        body.endswith(b"data: [DONE]\n\n") and b'"finish_reason":"length"' in body and b'"error"' not in body
    )


@dataclass
class Run:
    results: list[bytes]
    cluster: FleetCluster
    states: dict[str, str]
    """Each simulated replica's state once the scale-in is done."""
    in_flight_at_start: dict[str, int]
    gateway_replicas: list[str]

    @property
    def early(self) -> list[bytes]:
        return [body[-160:] for body in self.results if not whole(body)]


async def scale_in_under_load(tmp_path: Path, drain: bool) -> Run:
    """3 replicas to 1 by the closed loop (policy max_replicas 1) while CLIENTS streams run."""
    token = tmp_path / "token"
    token.write_text(API_TOKEN)
    async with (
        SimFleet(replicas=3, time_scale=1.0, seed=0, control_port=0, overrides={"warmup_s": 0}) as fleet,
        aiohttp.ClientSession() as session,
    ):
        assert fleet.control_url is not None
        cluster = FleetCluster(fleet.control_url)
        await cluster.adopt(session)
        async with fleet_api(cluster, session) as api_url:
            pool = {
                "name": "default",
                "kubernetes": {
                    "service": "vllm",
                    "namespace": "inference",
                    "refresh_s": 0.2,
                    "api_url": api_url,
                    "token_file": str(token),
                },
            }
            # connect_s: a loaded test machine may stall the event loop for seconds; a stream cut by
            # the scale-in shows as a cut stream, not as a connection that took long to open
            config = gateway_config(
                [],
                pools=[pool],
                auth={"admin_token": ADMIN_TOKEN},
                routing={"warmup_s": 0},
                server={"port": 0, "timeouts": {"connect_s": 30}},
            )
            async with (
                running_gateway(config) as gw,
                httpx.AsyncClient(base_url=gw.url, timeout=120.0) as http,
            ):
                assert await eventually(lambda: sum(r.healthy for r in gw.state.replicas.values()) == 3)
                stop = asyncio.Event()
                results: list[bytes] = []

                async def client_loop(i: int) -> None:
                    n = 0
                    while not stop.is_set():
                        results.append(await stream(http, f"c{i}-{n}"))
                        n += 1

                clients = [asyncio.create_task(client_loop(i)) for i in range(CLIENTS)]
                assert await eventually(lambda: sum(gw.state.in_flight_by_replica().values()) >= CLIENTS - 1)
                in_flight_at_start = gw.state.in_flight_by_replica()
                api_client = client.ApiClient(client.Configuration(host=api_url))
                apps = client.AppsV1Api(api_client)
                if drain:
                    actuator = KubernetesActuator(
                        apps,
                        "inference",
                        {"default": "vllm"},
                        pods=client.CoreV1Api(api_client),
                        session=session,
                        gateways=GatewaySources(urls=(gw.url,)).resolve,
                        admin_token=ADMIN_TOKEN,
                        drain_timeout_s=60.0,
                        poll_s=0.05,
                        log=lambda line: None,
                    )
                else:
                    actuator = KubernetesActuator(apps, "inference", {"default": "vllm"})
                policy = {"interval_s": 0.2, "policy": {"min_replicas": 1, "max_replicas": 1}}
                lines: list[str] = []
                sources = GatewaySources(urls=(gw.url,))
                rounds = await run_loop(
                    session, sources, actuator, AutoscalerConfig.model_validate(policy), lines.append, 2
                )
                assert rounds == 2, lines
                await asyncio.gather(*cluster.removals)
                await asyncio.sleep(0.3)  # streams on in the new fleet for a moment
                stop.set()
                await asyncio.gather(*clients)
                api_client.close()
                await assert_idle(gw)
                states = {r.url: r.state for r in fleet.replicas}
                return Run(results, cluster, states, in_flight_at_start, list(gw.state.replicas))


async def test_a_closed_loop_scale_in_under_streaming_load_ends_no_stream_early(tmp_path: Path) -> None:
    run = await scale_in_under_load(tmp_path, drain=True)
    assert not run.early, f"{len(run.early)} of {len(run.results)} streams ended early: {run.early[:3]}"
    assert len(run.results) > CLIENTS
    assert run.cluster.replicas == 1 and len(run.cluster.deleted) == 2
    (kept,) = run.cluster.pods.values()
    assert kept["metadata"]["labels"][ROUTABLE] == "true" and COST not in kept["metadata"]["annotations"]
    assert run.gateway_replicas == [run.cluster.url_of(kept["metadata"]["name"])]
    removed = [url for url, state in run.states.items() if state == "removed"]
    assert len(removed) == 2, run.states
    assert any(run.in_flight_at_start.get(url, 0) > 0 for url in removed), (
        "the removed replicas were streaming"
    )


async def test_the_same_scale_in_without_the_drain_cuts_streams(tmp_path: Path) -> None:
    run = await scale_in_under_load(tmp_path, drain=False)
    assert run.early, "without the drain the stand-in's grace period cuts the removed replicas' streams"
