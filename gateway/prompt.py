"""The prompt's token ids, counted the way each model's config says.

Tokenisers come from the top-level ``models[]`` entries (the one home of model facts). A local
tokeniser runs inline for small prompts and in a worker thread above ``OFF_LOOP_TEXT_BYTES`` of text,
so one huge prompt never stalls every other request on the event loop. Prompts counted inline are
remembered, by model and text, in a bounded least-recently-used map (``CACHED_PROMPTS``): a repeated
prompt (a system prompt, a retried or replayed request) costs one dictionary lookup instead of a
tokenisation. The ids handed out are shared between requests and never mutated. Kind ``replica``
asks a replica of the model's pool for its own count (``POST /tokenize``): exact, one round trip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from admission.counting import encode_prompt, prompt_of, template_for, tokenizer_for
from admission.tokenizer import prompt_text
from config.schema import Model

OFF_LOOP_TEXT_BYTES = 32 * 1024
CACHED_PROMPTS = 1024


class PromptEncoder:
    """Token ids of a request body, per model."""

    def __init__(self, models: Sequence[Model]) -> None:
        self._local = {m.name: (tokenizer_for(m.tokenizer), template_for(m.chat_template)) for m in models}
        self._cache: dict[tuple[str, str], list[int]] = {}

    def is_local(self, model: str) -> bool:
        """Whether ``model`` is counted here (no replica needed)."""
        return self._local[model][0] is not None

    def encode_inline(self, model: str, body: Mapping[str, Any], raw_size_bytes: int) -> list[int] | None:
        """The ids when they are counted here, on the event loop (a local tokeniser and a body of at
        most ``OFF_LOOP_TEXT_BYTES``); None when ``encode`` must ask a replica or a worker thread."""
        tokenizer, template = self._local[model]
        if tokenizer is None or raw_size_bytes > OFF_LOOP_TEXT_BYTES:
            return None
        prompt = prompt_of(body, template)
        if isinstance(prompt, list):
            return prompt
        cache = self._cache
        key = (model, prompt)
        ids = cache.pop(key, None)
        if ids is None:
            ids = tokenizer.encode(prompt)
            if len(cache) >= CACHED_PROMPTS:
                del cache[next(iter(cache))]
        cache[key] = ids
        return ids

    async def encode(
        self,
        model: str,
        body: Mapping[str, Any],
        raw_size_bytes: int,
        session: aiohttp.ClientSession,
        url: str,
        headers: Mapping[str, str] | None = None,
    ) -> list[int]:
        """``headers`` go with a ``/tokenize`` call (the pool's ``Authorization``)."""
        ids = self.encode_inline(model, body, raw_size_bytes)
        if ids is not None:
            return ids
        tokenizer, template = self._local[model]
        if tokenizer is None:
            return await _replica_tokens(session, url, model, body, headers)
        return await asyncio.to_thread(encode_prompt, body, tokenizer, template)


async def _replica_tokens(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None,
) -> list[int]:
    payload: dict[str, Any] = {"model": model}
    if "messages" in body:
        payload["messages"] = body["messages"]
    else:
        payload["prompt"] = prompt_text(body.get("prompt"))
    async with session.post(url + "/tokenize", json=payload, headers=headers) as response:
        response.raise_for_status()
        answer = await response.json()
    tokens = answer.get("tokens")
    if isinstance(tokens, list):
        return [int(t) for t in tokens]
    return [0] * int(answer.get("count", 0))
