"""Two ``kvgate serve`` processes in front of one real vLLM replica, admitting as one through claims
in a real Redis: each sees the other, their claims on the replica never sum past the capacity it
reports, the SDK is served through both at once, and when they stop nothing is left in Redis."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import openai
import pytest
import redis.asyncio as aioredis

from tests.integration.processes import assert_process_idle, serving_process, stop
from tests.vllm.conftest import cache_config, gateway_config, metric_total
from tests.vllm.servers import SERVED_MODEL, VllmServer

pytestmark = pytest.mark.vllm


async def test_two_gateways_share_a_replica_through_redis(
    replica: VllmServer, redis_url: str, tmp_path: Path
) -> None:
    namespace = f"kvgate-vllm-{uuid.uuid4().hex[:8]}"
    coordination = {"redis_url": redis_url, "namespace": namespace, "interval_s": 0.1, "lease_s": 2.0}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with (
        serving_process(tmp_path / "a", gateway_config([replica.url], coordination=coordination)) as (a, one),
        serving_process(tmp_path / "b", gateway_config([replica.url], coordination=coordination)) as (b, two),
    ):
        for _ in range(100):
            seen = [await metric_total(url, "kvgate_coordination_gateways") for url in (a, b)]
            if seen == [2.0, 2.0]:
                break
            await asyncio.sleep(0.1)
        assert seen == [2.0, 2.0]
        assert [await metric_total(url, "kvgate_coordination_up") for url in (a, b)] == [1.0, 1.0]
        await asyncio.gather(*(traffic(url, index) for index in range(6) for url in (a, b)))
        claimed = [await metric_total(url, "kvgate_coordination_claim_kv_tokens") for url in (a, b)]
        capacity = int((await cache_config(replica.url))["kv_cache_size_tokens"])
        assert 0 < sum(claimed) <= capacity, (claimed, capacity)
        await assert_process_idle(a)
        await assert_process_idle(b)
        assert [await stop(one), await stop(two)] == [0, 0]
    client = aioredis.from_url(redis_url)
    try:
        assert [key async for key in client.scan_iter(f"{{{namespace}}}*")] == [], "stopped gateways clean up"
    finally:
        await client.aclose()


async def traffic(url: str, index: int) -> None:
    """One chat and one stream through the gateway at ``url``, each coming back whole (a real
    replica may pack several tokens in one chunk: usage, not chunks, counts them)."""
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as sdk:
        chat = await sdk.chat.completions.create(
            model=SERVED_MODEL,
            messages=[{"role": "user", "content": f"question {index}"}],
            max_tokens=8,
            extra_body={"ignore_eos": True},
        )
        assert chat.usage is not None and chat.usage.completion_tokens == 8
        stream = await sdk.completions.create(
            model=SERVED_MODEL,
            prompt=f"story {index}",
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        usage = [chunk.usage async for chunk in stream][-1]
        assert usage is not None and usage.completion_tokens == 40
