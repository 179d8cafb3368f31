"""``python -m kvgate sim`` as a process: it serves its replicas and stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys

import aiohttp

from kvgate.sim.ports import free_ports


async def test_standalone_simulator_serves_and_stops_on_sigterm() -> None:
    port, control = free_ports(2), free_ports()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "kvgate", "sim", "--replicas", "2", "--port", str(port), "--control-port", str(control)),
        *("--cold-start-s", "0", "--time-scale", "0", "--kv-capacity-tokens", "16000"),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        banner = await asyncio.wait_for(process.stdout.readline(), 30)
        assert b"16000 KV tokens" in banner
        async with aiohttp.ClientSession() as http:
            for _ in range(300):
                try:
                    async with http.get(f"http://127.0.0.1:{control}/replicas") as r:
                        replicas = (await r.json())["replicas"]
                    if all(x["state"] == "ready" for x in replicas):
                        break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.05)
            assert [x["port"] for x in replicas] == [port, port + 1]
            body = {"prompt": "hello", "max_tokens": 3}
            async with http.post(f"http://127.0.0.1:{port + 1}/v1/completions", json=body) as r:
                assert (await r.json())["usage"]["completion_tokens"] == 3
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
