"""A simulated replica's prompts as token ids and prefix block hashes, cached by text.

The gateway sends the same system prompts and documents again and again; tokenising each once keeps
the simulator's CPU per request low enough to stand in for many replicas in one process.
"""

from __future__ import annotations

from collections import OrderedDict

from kvgate.admission.tokenizer import ChatTemplate, Tokenizer
from kvgate.routing.prefix_hash import block_hashes

ENCODE_CACHE_ENTRIES = 2048

Prompt = tuple[list[int], list[int]]
"""Token ids and the block hashes of their full blocks."""


class PromptEncoder:
    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate, block_size_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.block_size_tokens = block_size_tokens
        self._encoded: OrderedDict[str, Prompt] = OrderedDict()

    def encode(self, text: str) -> Prompt:
        cached = self._encoded.get(text)
        if cached is not None:
            self._encoded.move_to_end(text)
            return cached
        ids = self.tokenizer.encode(text)
        entry = (ids, block_hashes(ids, self.block_size_tokens))
        self._encoded[text] = entry
        if len(self._encoded) > ENCODE_CACHE_ENTRIES:
            self._encoded.popitem(last=False)
        return entry

    def token_ids(self, token_ids: list[int]) -> Prompt:
        """A prompt sent as token ids, with its block hashes (nothing to tokenise)."""
        return token_ids, block_hashes(token_ids, self.block_size_tokens)
