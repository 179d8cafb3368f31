"""``kvgate`` as its own process, as operators run it: start it with a config, wait until it is
ready, read its work gauges, stop it. Shared by the tests that need the real process (uvloop, signal
handling, the command line) rather than a gateway in the test's own event loop."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import aiohttp
import openai
import orjson
from aiohttp import web

from kvgate.loadtest.client import wait_until_ok

KVGATE = str(Path(sys.executable).parent / "kvgate")
WORK_GAUGES = (
    "kvgate_pending_prompt_tokens",
    "kvgate_prefill_work_tokens",
    "kvgate_queued_prompt_tokens",
    "kvgate_queued_requests",
    "kvgate_remaining_decode_tokens",
    "kvgate_resident_sequences",
)


@asynccontextmanager
async def serving_process(
    tmp_path: Path,
    config: dict[str, Any],
    *args: str,
    port: int | None = None,
    stderr: IO[bytes] | None = None,
) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """``kvgate serve --config FILE ARGS`` with ``config`` written to FILE, yielded with its URL once
    ``/readyz`` answers (on ``port``, else the config's ``server.port``); killed on exit unless the
    test already stopped it. Its stderr (the access log) goes to ``stderr``, else to the test's."""
    config_file = tmp_path / "kvgate.yaml"
    config_file.write_bytes(orjson.dumps(config))  # JSON is YAML
    command = (KVGATE, "serve", "--config", str(config_file), *args)
    process = await asyncio.create_subprocess_exec(*command, stderr=stderr)
    url = f"http://127.0.0.1:{port if port is not None else config['server']['port']}"
    try:
        async with aiohttp.ClientSession() as http:
            await wait_until_ok(http, url + "/readyz")
        yield url, process
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@asynccontextmanager
async def serving_app(app: web.Application) -> AsyncIterator[str]:
    """``app`` served on a free loopback port for the block: its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def stop(process: asyncio.subprocess.Process, sig: int = signal.SIGTERM) -> int:
    """Send ``sig`` and wait (bounded) for the exit status."""
    process.send_signal(sig)
    return await asyncio.wait_for(process.wait(), 30)


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


async def assert_process_idle(url: str) -> None:
    """The process's work gauges all come back to exactly zero (polled, bounded)."""
    values: dict[str, float] = {}
    for _ in range(100):
        values = await gauges(url)
        if values and all(value == 0 for value in values.values()):
            break
        await asyncio.sleep(0.05)
    assert len(values) >= len(WORK_GAUGES) and all(value == 0 for value in values.values()), values


async def sdk_traffic(url: str, model: str, chats: int, stream_tokens: int) -> None:
    """``chats`` chat completions of 8 tokens and one stream of ``stream_tokens``, through the
    official SDK as an application would send them; each must come back whole."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    async with client:
        answers = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": f"question {i}"}],
                    max_tokens=8,
                    extra_body={"ignore_eos": True},
                )
                for i in range(chats)
            )
        )
        assert all(a.usage is not None and a.usage.completion_tokens == 8 for a in answers)
        stream = await client.completions.create(
            model=model,
            prompt="tell a story",
            max_tokens=stream_tokens,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        pieces = [chunk async for chunk in stream]
        assert sum(1 for chunk in pieces if chunk.choices) == stream_tokens
