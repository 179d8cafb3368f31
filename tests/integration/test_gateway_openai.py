"""The official openai SDK, pointed at kvgate, works unchanged."""

from __future__ import annotations

import openai
import pytest

from kvgate.gateway.edge.server import running_gateway
from kvgate.sim.fleet import SimFleet
from tests.integration.conftest import MODEL, assert_idle, gateway_config


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


async def test_chat_and_completions_with_and_without_streaming(fleet: SimFleet) -> None:
    async with running_gateway(gateway_config(fleet.urls)) as gw, client(gw.url) as sdk:
        chat = await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hello"}], max_tokens=8
        )
        assert chat.choices[0].message.content
        assert chat.usage is not None and chat.usage.prompt_tokens > 0 and chat.usage.completion_tokens > 0

        completion = await sdk.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8)
        assert completion.choices[0].text
        assert completion.usage is not None and completion.usage.completion_tokens > 0

        stream = await sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count"}],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0

        text_stream = await sdk.completions.create(
            model=MODEL, prompt="A", max_tokens=6, stream=True, stream_options={"include_usage": True}
        )
        text_chunks = [chunk async for chunk in text_stream]
        assert "".join(c.choices[0].text for c in text_chunks if c.choices)
        assert text_chunks[-1].usage is not None

        models = await sdk.models.list()
        assert [m.id for m in models.data] == [MODEL]
        await assert_idle(gw)


async def test_errors_map_to_sdk_exceptions(fleet: SimFleet) -> None:
    async with running_gateway(gateway_config(fleet.urls)) as gw, client(gw.url) as sdk:
        with pytest.raises(openai.NotFoundError) as not_found:
            await sdk.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "x"}]
            )
        assert "The model `no-such-model` does not exist." in str(not_found.value)

        with pytest.raises(openai.BadRequestError):
            await sdk.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "x"}],
                max_tokens=8,
                extra_body={"min_tokens": 9},
            )
        with pytest.raises(openai.BadRequestError):
            await sdk.completions.create(model=MODEL, prompt="x", max_tokens=8, extra_body={"stream": "yes"})
        await assert_idle(gw)
