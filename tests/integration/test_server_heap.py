"""``kvgate serve`` moves its start-up heap out of the garbage collector's sight once it serves, so
full collections under load do not walk it; a gateway started for a test leaves the heap alone."""

from __future__ import annotations

import asyncio
import gc

import httpx

from kvgate.gateway.edge.app import Gateway
from kvgate.gateway.edge.server import DrainingServer, bind_socket, running_gateway, uvicorn_config
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, gateway_config


async def test_the_serving_process_freezes_its_start_up_heap_and_still_serves() -> None:
    async with SimFleet(replicas=1, time_scale=0.0, seed=0) as fleet:
        config = gateway_config(fleet.urls)
        gateway = Gateway(config)
        sock = bind_socket("127.0.0.1", 0)
        server = DrainingServer(uvicorn_config(gateway, "127.0.0.1", 0), gateway, freeze_heap=True)
        assert gc.get_freeze_count() == 0
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                await asyncio.sleep(0.01)
            assert gc.get_freeze_count() > 10_000
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
                assert (await http.post("/v1/completions", json=body)).status_code == 200
        finally:
            server.drain(0.0, 0.0)
            await task
            sock.close()
            gc.unfreeze()


async def test_a_gateway_started_in_a_test_process_freezes_nothing() -> None:
    async with (
        SimFleet(replicas=1, time_scale=0.0, seed=0) as fleet,
        running_gateway(gateway_config(fleet.urls)),
    ):
        assert gc.get_freeze_count() == 0
