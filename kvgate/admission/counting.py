"""Which tokeniser and chat template count a model's prompts, and the count of one request body.

Both come from the model's entry in the top-level ``models[]`` (the one home of model facts). The
configured kind picks an implementation of the ``Tokenizer`` seam; nothing is fetched at run
time (a named tiktoken encoding comes from an installed package, files are local). The replica's
own ``/tokenize`` is exact but is a network round trip, so it lives at the edge: for that kind
``tokenizer_for`` returns None and the edge asks the replica; when no replica can count, the
request is answered 503 (``no_replica``), never priced by a guess. Encoding a large prompt is CPU
work; the edge counts it off its event loop, in pieces it can stop (``kvgate.admission.encode_job``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvgate.admission.tokenizer import (
    BytesEstimateTokenizer,
    ChatTemplate,
    HuggingFaceTokenizer,
    JinjaChatTemplate,
    TiktokenTokenizer,
    Tokenizer,
    prompt_text,
)
from kvgate.config.models import ChatTemplate as ChatTemplateConfig
from kvgate.config.models import TokenizerConfig


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
    """The model's own Jinja template when the config names its file, otherwise the framing given."""
    if config.file is not None:
        return JinjaChatTemplate.from_file(config.file)
    return ChatTemplate(config.message_prefix, config.message_suffix, config.generation_prompt, config.bos)


def prompt_of(body: Mapping[str, Any], template: ChatTemplate) -> str | list[int]:
    """What to tokenise in a request body: a chat's ``messages`` after the template, a completions
    ``prompt`` as text, or the token ids a completions client sent itself (counted as they are).
    A batch of prompts (``batch_of``) is counted one prompt at a time, each given as its own body."""
    messages = body.get("messages")
    if isinstance(messages, list):
        # ``type(m) is dict`` first: a parsed body's messages are dicts, and asking the ``Mapping``
        # ABC costs a Python-level ``__instancecheck__`` per message.
        return template.render([m for m in messages if type(m) is dict or isinstance(m, Mapping)])
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        return [t for p in prompt for t in p if isinstance(t, int)]
    return prompt_text(prompt)


def batch_of(body: Mapping[str, Any]) -> list[str] | list[list[int]] | None:
    """The prompts of a completions batch (a list of two or more strings, or of token-id lists), or
    None for a request with one prompt. vLLM runs each prompt of a batch as its own request (with its
    own ``n`` sequences), so each is counted and priced on its own."""
    if "messages" in body:
        return None
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or len(prompt) < 2:
        return None
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, list) for p in prompt):
        return [[t for t in p if isinstance(t, int)] for p in prompt]
    return None
