"""The official SDK's embeddings, responses (streamed and not) and model retrieval through
``kvgate up``, the embedded default a newcomer starts with, as a process; its work gauges end at
zero."""

from __future__ import annotations

import asyncio
import signal

import aiohttp
import openai

from kvgate.loadtest.client import wait_until_ok
from kvgate.sim.fleet import DEFAULT_MODEL
from kvgate.sim.ports import free_ports
from tests.integration.processes import KVGATE, assert_process_idle, stop


async def test_the_sdk_embeds_responds_and_retrieves_through_kvgate_up() -> None:
    port = free_ports()
    url = f"http://127.0.0.1:{port}"
    process = await asyncio.create_subprocess_exec(
        KVGATE,
        *("up", "--replicas", "1", "--no-autoscale", "--port", str(port), "--time-scale", "0"),
        stdout=asyncio.subprocess.DEVNULL,
    )
    try:
        async with aiohttp.ClientSession() as session:
            await wait_until_ok(session, url + "/readyz")
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
            embedded = await sdk.embeddings.create(model=DEFAULT_MODEL, input="the prefix cache")
            assert len(embedded.data) == 1 and embedded.data[0].embedding
            answer = await sdk.responses.create(model=DEFAULT_MODEL, input="hello", max_output_tokens=5)
            assert answer.output_text and answer.usage is not None and answer.usage.output_tokens == 5
            stream = await sdk.responses.create(
                model=DEFAULT_MODEL, input="hello", max_output_tokens=5, stream=True
            )
            kinds = [event.type async for event in stream]
            assert kinds.count("response.output_text.delta") == 5 and kinds[-1] == "response.completed"
            assert (await sdk.models.retrieve(DEFAULT_MODEL)).id == DEFAULT_MODEL
        await assert_process_idle(url)
    finally:
        code = await stop(process, signal.SIGINT)
    assert code in (0, 130, -signal.SIGINT), code
