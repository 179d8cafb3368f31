"""``kvgate serve`` as its own process, as operators run it (uvicorn on uvloop with httptools), in
front of a simulated fleet: the openai SDK streams and not, and the gateway's own gauges come back
to zero afterwards. The other integration tests run the gateway in the test's event loop, which is
the default asyncio loop; this one covers the production loop end to end."""

from __future__ import annotations

from pathlib import Path

from kvgate.sim.fleet import SimFleet
from kvgate.sim.ports import free_ports
from tests.integration.conftest import MODEL
from tests.integration.processes import assert_process_idle, sdk_traffic, serving_process, stop


async def test_kvgate_serve_on_uvloop_proxies_the_sdk_and_returns_to_idle(tmp_path: Path) -> None:
    async with SimFleet(replicas=2, time_scale=0.0) as fleet:
        port = free_ports()
        config = {
            "server": {"host": "127.0.0.1", "port": port, "drain_delay_s": 0},
            "health": {"interval_s": 0.2, "timeout_s": 1.0},
            "models": [{"name": MODEL, "max_model_len": 131072, "kv_bytes_per_token": 131072}],
            "pools": [{"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": 450000}],
        }
        async with serving_process(tmp_path, config) as (url, process):
            await sdk_traffic(url, MODEL, chats=16, stream_tokens=20)
            await assert_process_idle(url)
            # an idle gateway drains at once after the drain delay and exits 0 (kvgate.gateway.edge.server)
            assert await stop(process) == 0
