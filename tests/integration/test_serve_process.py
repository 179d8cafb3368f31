"""``kvgate serve`` as its own process, as operators run it (uvicorn on uvloop with httptools), in
front of a simulated fleet: the openai SDK streams and not, and the gateway's own gauges come back
to zero afterwards. The other integration tests run the gateway in the test's event loop, which is
the default asyncio loop; this one covers the production loop end to end."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp
import openai
import orjson

from loadtest.client import wait_until_ok
from loadtest.sim.fleet import SimFleet, free_port
from tests.integration.conftest import MODEL

WORK_GAUGES = (
    "kvgate_pending_prompt_tokens",
    "kvgate_prefill_work_tokens",
    "kvgate_queued_prompt_tokens",
    "kvgate_queued_requests",
    "kvgate_remaining_decode_tokens",
    "kvgate_resident_sequences",
)


async def gauges(url: str) -> dict[str, float]:
    """Every sample of the gauges that describe work the gateway holds (reserved, queued)."""
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as response:
        text = await response.text()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(WORK_GAUGES):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


async def test_kvgate_serve_on_uvloop_proxies_the_sdk_and_returns_to_idle(tmp_path: Path) -> None:
    async with SimFleet(replicas=2, time_scale=0.0) as fleet:
        port = free_port()
        config = {
            "server": {"host": "127.0.0.1", "port": port},
            "health": {"interval_s": 0.2, "timeout_s": 1.0},
            "models": [{"name": MODEL, "max_model_len": 131072, "kv_bytes_per_token": 131072}],
            "pools": [{"name": "default", "replicas": fleet.urls, "kv_capacity_tokens": 450000}],
        }
        config_file = tmp_path / "kvgate.yaml"
        config_file.write_bytes(orjson.dumps(config))  # JSON is YAML
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "kvgate"), "serve", "--config", str(config_file)
        )
        url = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as http:
                await wait_until_ok(http, url + "/readyz")
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            answers = await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": f"question {i}"}], max_tokens=8
                    )
                    for i in range(16)
                )
            )
            assert all(a.usage is not None and a.usage.completion_tokens == 8 for a in answers)
            stream = await client.completions.create(
                model=MODEL,
                prompt="tell a story",
                max_tokens=20,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            pieces = [chunk async for chunk in stream]
            assert sum(1 for chunk in pieces if chunk.choices) == 20
            await client.close()
            for _ in range(100):
                values = await gauges(url)
                if values and all(value == 0 for value in values.values()):
                    break
                await asyncio.sleep(0.05)
            assert len(values) >= 6 and all(value == 0 for value in values.values()), values
        finally:
            process.send_signal(signal.SIGTERM)
            # an idle gateway drains at once after the drain delay and exits 0 (gateway.server)
            assert await asyncio.wait_for(process.wait(), 30) == 0
