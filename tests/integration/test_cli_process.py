"""The ``kvgate`` commands that run things, as processes (or their loops against real gateways):
``serve --host/--port`` listens where the flags say; ``autoscale`` over several gateways sees the
fleet's demand, not one gateway's share; ``kvgate up`` runs the closed loop, so the simulated
fleet changes size through its control API and the gateway publishes the desired replicas."""

from __future__ import annotations

import asyncio
import io
import signal
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from kvgate.autoscaler.actuators import LogActuator
from kvgate.autoscaler.loop import GatewaySources, read_signals, run_loop
from kvgate.config.autoscaler import AutoscalerConfig
from kvgate.gateway.edge.server import running_gateway
from kvgate.loadtest.client import wait_until_ok
from kvgate.sim.fleet import SimFleet
from kvgate.sim.ports import free_ports
from tests.integration.conftest import MODEL, assert_idle, eventually, gateway_config
from tests.integration.processes import KVGATE, serving_process, stop


async def test_serve_listens_on_the_host_and_port_the_flags_give(tmp_path: Path) -> None:
    async with SimFleet(replicas=1, time_scale=0.0) as fleet:
        file_port, flag_port = free_ports(), free_ports()
        config = {
            "server": {"host": "127.0.0.1", "port": file_port, "drain_delay_s": 0},
            "models": [{"name": MODEL, "max_model_len": 131072, "kv_bytes_per_token": 131072}],
            "pools": [{"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": 450000}],
        }
        flags = ("--host", "127.0.0.1", "--port", str(flag_port))
        async with (
            serving_process(tmp_path, config, *flags, port=flag_port) as (_, process),
            aiohttp.ClientSession() as http,
        ):
            try:
                async with http.get(f"http://127.0.0.1:{file_port}/readyz"):
                    raise AssertionError("the gateway also listens on the file's port")
            except aiohttp.ClientConnectionError:
                pass
            assert await stop(process) == 0


async def stream_story(http: httpx.AsyncClient) -> bytes:
    body = {"model": MODEL, "prompt": "A long story", "max_tokens": 120, "stream": True, "ignore_eos": True}
    async with http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        return b"".join([chunk async for chunk in response.aiter_raw()])


async def test_autoscale_reads_every_gateway_and_adds_their_work() -> None:
    """Two gateways in front of one fleet, three streams through one and two through the other:
    the loop's view of the pool holds all five, and the policy runs on that view."""
    async with SimFleet(replicas=2, time_scale=1.0, seed=0) as fleet:
        config = gateway_config(fleet.urls)
        async with (
            running_gateway(config) as gw1,
            running_gateway(config) as gw2,
            httpx.AsyncClient(base_url=gw1.url, timeout=60.0) as http1,
            httpx.AsyncClient(base_url=gw2.url, timeout=60.0) as http2,
            aiohttp.ClientSession() as session,
        ):
            streams = [asyncio.create_task(stream_story(http1)) for _ in range(3)]
            streams += [asyncio.create_task(stream_story(http2)) for _ in range(2)]
            assert await eventually(lambda: (gw1.state.in_flight, gw2.state.in_flight) == (3, 2))
            doc: dict[str, Any] = await read_signals(session, [gw1.url, gw2.url])
            pool = doc["pools"]["default"]
            assert doc["gateways"] == 2
            assert pool["resident_sequences"] == 5 and pool["replicas_current"] == 2
            out = io.StringIO()
            sources = GatewaySources(urls=(gw1.url,), dns_urls=(gw2.url,))
            assert await sources.resolve() == [gw1.url, gw2.url]
            ran = await run_loop(
                session, sources, LogActuator(out), AutoscalerConfig(), report=print, iterations=1
            )
            assert ran == 1 and out.getvalue().startswith("pool=default desired=")
            for body in await asyncio.gather(*streams):
                assert body.endswith(b"data: [DONE]\n\n")
            await assert_idle(gw1)
            await assert_idle(gw2)


async def test_kvgate_up_runs_the_autoscaler_against_its_simulated_fleet() -> None:
    """One replica at start, a floor of two: the loop adds one through the simulator's control API
    (it cold-starts), the gateway learns of it and publishes the desired count, and the change is
    printed as one line."""
    port = free_ports()
    process = await asyncio.create_subprocess_exec(
        KVGATE,
        *("up", "--replicas", "1", "--min-replicas", "2", "--max-replicas", "3", "--port", str(port)),
        *("--time-scale", "0.01", "--autoscale-interval-s", "0.2"),
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    lines: list[str] = []
    try:
        control_url = None
        while not any(line.startswith("autoscaler: pool sim: 2 replica(s) (min_replicas)") for line in lines):
            line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
            assert line, "kvgate up exited:\n" + "".join(lines)
            lines.append(line)
            if "simulator control API " in line:
                control_url = line.rsplit(" ", 1)[1].strip()
        assert control_url is not None
        async with httpx.AsyncClient(timeout=30.0) as http:
            replicas: list[dict[str, Any]] = []
            for _ in range(600):
                replicas = (await http.get(control_url)).json()["replicas"]
                if [r["state"] for r in replicas] == ["ready", "ready"]:
                    break
                await asyncio.sleep(0.05)
            assert [r["state"] for r in replicas] == ["ready", "ready"]
            pool: dict[str, Any] = {}
            for _ in range(600):
                pool = (await http.get(f"http://127.0.0.1:{port}/signals")).json()["pools"]["sim"]
                if pool["replicas_ready"] == 2 and pool["desired_replicas"] == 2:
                    break
                await asyncio.sleep(0.05)
            assert (pool["replicas_current"], pool["replicas_ready"], pool["desired_replicas"]) == (2, 2, 2)
    finally:
        code = await stop(process, signal.SIGINT)
    assert code in (0, 130, -signal.SIGINT), code
    changes = [line for line in lines if line.startswith("autoscaler: pool sim:")]
    assert changes == ["autoscaler: pool sim: 2 replica(s) (min_replicas)\n"]


async def test_kvgate_up_without_the_autoscaler_publishes_nothing() -> None:
    port = free_ports()
    process = await asyncio.create_subprocess_exec(
        KVGATE,
        *("up", "--replicas", "1", "--min-replicas", "2", "--no-autoscale", "--port", str(port)),
        *("--time-scale", "0"),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        async with aiohttp.ClientSession() as session:
            await wait_until_ok(session, f"http://127.0.0.1:{port}/readyz")
            async with session.get(f"http://127.0.0.1:{port}/signals") as response:
                pool = (await response.json())["pools"]["sim"]
            assert (pool["replicas_current"], pool["desired_replicas"]) == (1, None)
    finally:
        await stop(process, signal.SIGINT)
    assert process.stdout is not None
    assert b"autoscaler:" not in await process.stdout.read()


async def test_kvgate_up_pd_serves_through_a_prefill_decode_pair_and_sizes_each_pool() -> None:
    port = free_ports()
    process = await asyncio.create_subprocess_exec(
        KVGATE,
        *("up", "--pd", "--replicas", "1", "--min-replicas", "1", "--max-replicas", "2", "--port", str(port)),
        *("--time-scale", "0", "--autoscale-interval-s", "0.2"),
        stdout=asyncio.subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            await wait_until_ok(session, url + "/readyz")
            body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "hi", "max_tokens": 5}
            async with session.post(url + "/v1/completions", json=body) as response:
                assert response.status == 200
                assert (await response.json())["usage"]["completion_tokens"] >= 1
            pools: dict[str, Any] = {}
            for _ in range(600):
                async with session.get(url + "/signals") as response:
                    pools = (await response.json())["pools"]
                if all(pools[p]["desired_replicas"] is not None for p in ("prefill", "decode")):
                    break
                await asyncio.sleep(0.05)
            assert {name: pool["role"] for name, pool in pools.items()} == {
                "prefill": "prefill",
                "decode": "decode",
            }
            assert all(pools[p]["desired_replicas"] == 1 for p in ("prefill", "decode")), pools
    finally:
        await stop(process, signal.SIGINT)
    assert process.stdout is not None
    banner = (await process.stdout.read()).decode()
    assert "(1 prefill + 1 decode: prefill/decode disaggregated)" in banner
