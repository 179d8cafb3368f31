"""Repeated prompts are counted once: the encoder's bounded cache returns the ids it computed."""

from __future__ import annotations

import aiohttp

from admission.counting import template_for
from admission.tokenizer import TiktokenTokenizer
from gateway.prompt import CACHED_PROMPTS, PromptEncoder
from tests.integration.conftest import MODEL, gateway_config


async def test_repeated_prompt_is_tokenised_once_and_the_cache_is_bounded() -> None:
    model = gateway_config(["http://127.0.0.1:1"]).models[0]
    encoder = PromptEncoder([model])
    expected = TiktokenTokenizer.from_name().encode(
        template_for(model.chat_template).render([{"role": "user", "content": "hello there"}])
    )

    def chat(text: str) -> dict[str, object]:
        return {"model": MODEL, "messages": [{"role": "user", "content": text}]}

    async with aiohttp.ClientSession() as session:
        first = await encoder.encode(MODEL, chat("hello there"), 100, session, "")
        again = await encoder.encode(MODEL, chat("hello there"), 100, session, "")
        assert first == expected
        assert again is first
        for i in range(CACHED_PROMPTS):
            await encoder.encode(MODEL, chat(f"prompt {i}"), 100, session, "")
        evicted = await encoder.encode(MODEL, chat("hello there"), 100, session, "")
        assert evicted == expected and evicted is not first
        ids = [1, 2, 3]
        assert await encoder.encode(MODEL, {"model": MODEL, "prompt": ids}, 100, session, "") == ids
