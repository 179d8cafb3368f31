"""Which tokeniser and chat template count a model's prompts, and the count of one request body.

Both come from the model's entry in the top-level ``models[]`` (the one home of model facts). The
configured kind picks an implementation of the ``Tokenizer`` seam; nothing is fetched at run
time (a named tiktoken encoding comes from an installed package, files are local). The replica's
own ``/tokenize`` is exact but is a network round trip, so it lives at the edge: for that kind
``tokenizer_for`` returns None and the edge asks the replica, falling back to a bytes estimate.
Counting a large prompt is CPU work; the edge runs ``count_prompt`` off its event loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from admission.tokenizer import (
    BytesEstimateTokenizer,
    ChatTemplate,
    HuggingFaceTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    count_chat,
    prompt_text,
)
from config.schema import ChatTemplate as ChatTemplateConfig
from config.schema import TokenizerConfig


def tokenizer_for(config: TokenizerConfig) -> Tokenizer | None:
    """The configured tokeniser; None for kind 'replica' (counted by the replica's /tokenize)."""
    if config.kind == "tiktoken":
        return TiktokenTokenizer.from_name(config.encoding)
    if config.kind == "tiktoken_file":
        return TiktokenTokenizer.from_bpe_file(config.path)
    if config.kind == "huggingface":
        return HuggingFaceTokenizer.from_file(config.path)
    if config.kind == "bytes":
        return BytesEstimateTokenizer(config.bytes_per_token)
    return None


def template_for(config: ChatTemplateConfig) -> ChatTemplate:
    return ChatTemplate(config.message_prefix, config.message_suffix, config.generation_prompt, config.bos)


def count_prompt(body: Mapping[str, Any], tokenizer: Tokenizer, template: ChatTemplate) -> int:
    """Prompt tokens of a chat (``messages``, after the template) or completions (``prompt``) body.

    A completions prompt given as token ids counts its ids.
    """
    messages = body.get("messages")
    if isinstance(messages, list):
        return count_chat(tokenizer, [m for m in messages if isinstance(m, Mapping)], template)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        return sum(len(p) for p in prompt)
    return tokenizer.count(prompt_text(prompt))
