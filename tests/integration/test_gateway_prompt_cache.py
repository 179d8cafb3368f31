"""Repeated prompts are counted once: the encoder's bounded cache returns the count and block hashes it
computed."""

from __future__ import annotations

import aiohttp

from kvgate.admission.counting import template_for
from kvgate.admission.tokenizer import RUN_CHARS, TiktokenTokenizer
from kvgate.gateway.request_path.prompt import CACHED_PROMPTS, PromptEncoder, PromptTokens
from kvgate.routing.prefix_hash import block_hashes
from tests.integration.conftest import MODEL, gateway_config


async def test_repeated_prompt_is_tokenised_once_and_the_cache_is_bounded() -> None:
    model = gateway_config(["http://127.0.0.1:1"]).models[0]
    encoder = PromptEncoder([model], 16)
    expected = PromptTokens.of(
        TiktokenTokenizer.from_name().encode(
            template_for(model.chat_template).render([{"role": "user", "content": "hello there"}])
        ),
        16,
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
        ids = list(range(40))
        given = await encoder.encode(MODEL, {"model": MODEL, "prompt": ids}, 100, session, "")
        assert given == PromptTokens(40, tuple(block_hashes(ids)))


async def test_a_long_prompt_counted_off_the_loop_has_the_whole_prompts_count_and_blocks() -> None:
    model = gateway_config(["http://127.0.0.1:1"]).models[0]
    encoder = PromptEncoder([model], 16)
    text = " ".join(f"word{i} and {i * 7} more" for i in range(12_000))
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    ids = TiktokenTokenizer.from_name().encode(template_for(model.chat_template).render(body["messages"]))
    assert len(text) > 3 * RUN_CHARS and model.max_model_len > len(ids), "counted in runs, and fits"
    async with aiohttp.ClientSession() as session:
        counted = await encoder.encode(MODEL, body, len(text), session, "")
    assert counted == PromptTokens.of(ids, 16)
    assert encoder.tokens_counted == len(ids)
