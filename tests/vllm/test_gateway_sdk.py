"""``kvgate serve`` in front of a real vLLM replica, driven by the official OpenAI SDK: chat and
completions, streamed and not, ``n``, usage, errors; the replica's capacity discovered from its own
``vllm:cache_config_info``; prompts counted exactly by its ``/tokenize``; its prefix cache hit. Every
test ends with the gateway holding nothing."""

from __future__ import annotations

from asyncio.subprocess import Process
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.integration.processes import assert_process_idle, serving_process
from tests.vllm.conftest import cache_config, gateway_config, metric_total
from tests.vllm.servers import MAX_MODEL_LEN, SERVED_MODEL, VllmServer

pytestmark = pytest.mark.vllm

CHAT: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello world, who are you?"},
]
IGNORE_EOS = {"ignore_eos": True}


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def kvgate_in_front_of(
    replica: VllmServer, tmp_path: Path
) -> AbstractAsyncContextManager[tuple[str, Process]]:
    return serving_process(tmp_path, gateway_config([replica.url]))


async def test_the_sdk_end_to_end_through_kvgate(replica: VllmServer, tmp_path: Path) -> None:
    async with kvgate_in_front_of(replica, tmp_path) as (url, _process), client(url) as sdk:
        chat = await sdk.chat.completions.create(
            model=SERVED_MODEL, messages=CHAT, max_tokens=8, extra_body=IGNORE_EOS
        )
        assert chat.model == SERVED_MODEL and chat.choices[0].finish_reason == "length"
        assert chat.usage is not None and chat.usage.completion_tokens == 8

        two = await sdk.completions.create(
            model=SERVED_MODEL, prompt="Once upon a time", max_tokens=5, n=2, extra_body=IGNORE_EOS
        )
        assert [c.index for c in two.choices] == [0, 1]
        assert two.usage is not None and two.usage.completion_tokens == 10

        stream = await sdk.chat.completions.create(
            model=SERVED_MODEL,
            messages=CHAT,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=IGNORE_EOS,
        )
        chunks = [chunk async for chunk in stream]
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-2].choices[0].finish_reason == "length"
        usage = chunks[-1].usage
        assert chunks[-1].choices == [] and usage is not None and usage.completion_tokens == 12

        plain = await sdk.completions.create(
            model=SERVED_MODEL, prompt="tell a story", max_tokens=20, n=2, stream=True, extra_body=IGNORE_EOS
        )
        pieces = [chunk async for chunk in plain]
        assert all(chunk.choices for chunk in pieces), "usage not asked for: the gateway's chunk is removed"
        finished = sorted(c.index for chunk in pieces for c in chunk.choices if c.finish_reason == "length")
        assert finished == [0, 1]
        await assert_process_idle(url)

        # Counted by the replica's own /tokenize: kvgate's estimate is exactly vLLM's prompt_tokens.
        count = await metric_total(url, "kvgate_tokenizer_estimate_ratio_count")
        ratio_sum = await metric_total(url, "kvgate_tokenizer_estimate_ratio_sum")
        below = await metric_total(url, 'kvgate_tokenizer_estimate_ratio_bucket{le="0.98"')
        assert count >= 4 and ratio_sum == count and below == 0


async def test_bad_input_gets_openai_errors_and_over_context_stops_at_the_gateway(
    replica: VllmServer, tmp_path: Path
) -> None:
    long_prompt = [7] * 1000
    past_window = MAX_MODEL_LEN - 999
    async with kvgate_in_front_of(replica, tmp_path) as (url, _process), client(url) as sdk:
        with pytest.raises(openai.NotFoundError):
            await sdk.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
        with pytest.raises(openai.BadRequestError) as negative:
            await sdk.completions.create(model=SERVED_MODEL, prompt="hi", max_tokens=2, temperature=-1)
        assert negative.value.body is not None and "temperature" in str(negative.value.body)
        with pytest.raises(openai.BadRequestError):
            await sdk.chat.completions.create(model=SERVED_MODEL, messages=CHAT, max_tokens=0)

        # vLLM itself runs a prompt + max_tokens past the window (and cuts the output); kvgate's
        # policy refuses it with a 400 before any replica sees it.
        served_before = await metric_total(replica.url, "vllm:request_success_total")
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.completions.create(model=SERVED_MODEL, prompt=long_prompt, max_tokens=past_window)
        assert "context length" in refused.value.message
        assert await metric_total(replica.url, "vllm:request_success_total") == served_before
        async with client(replica.url) as direct:
            cut = await direct.completions.create(
                model=SERVED_MODEL, prompt=long_prompt, max_tokens=past_window, extra_body=IGNORE_EOS
            )
        assert cut.choices[0].finish_reason == "length"
        assert cut.usage is not None and cut.usage.total_tokens == MAX_MODEL_LEN

        headers = {"content-type": "application/json"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(url + "/v1/completions", data=b'{"model": tiny', headers=headers) as response,
        ):
            assert response.status == 400
            assert set((await response.json())["error"]) == {"message", "type", "param", "code"}
        await assert_process_idle(url)


async def test_capacity_is_read_from_the_replicas_cache_config(replica: VllmServer, tmp_path: Path) -> None:
    reported = int((await cache_config(replica.url))["kv_cache_size_tokens"])
    async with (
        aiohttp.ClientSession() as http,
        kvgate_in_front_of(replica, tmp_path) as (url, _process),
        http.get(url + "/admin/pools/default") as response,
    ):
        pool = await response.json()
    (state,) = pool["replicas"]
    assert pool["kv_capacity_tokens"] is None, "nothing configured: discovered"
    assert state["discovered_kv_capacity_tokens"] == state["kv_capacity_tokens"] == reported
    assert state["scraped"]["block_size_tokens"] == 128, "vLLM's CPU default"


async def test_a_repeated_prompt_hits_the_replicas_prefix_cache(replica: VllmServer, tmp_path: Path) -> None:
    document = " ".join(f"Paragraph {i} of the shared document about gateways and caches." for i in range(60))
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": document},
        {"role": "user", "content": "Summarise."},
    ]
    async with kvgate_in_front_of(replica, tmp_path) as (url, _process), client(url) as sdk:
        hits_before = await metric_total(replica.url, "vllm:prefix_cache_hits_total")
        for _ in range(2):
            await sdk.chat.completions.create(model=SERVED_MODEL, messages=messages, max_tokens=2)
        hits = await metric_total(replica.url, "vllm:prefix_cache_hits_total") - hits_before
        await assert_process_idle(url)
    assert hits >= 4 * 128, "the second request reuses the first one's full 128-token blocks"
