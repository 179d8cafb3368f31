"""What routing needs to know about one request: its model, its token cost and its prompt's blocks.

The block hashes are the chained hashes of the prompt's full 16-token blocks
(``kvgate.routing.prefix_hash.block_hashes``), computed once at the edge from the token ids the tokenizer
already produced, so prefix matching never sees text. ``kv_tokens`` is the worst case the request
can occupy: the whole prompt plus every output token it may produce.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.routing.prefix_hash import BLOCK_SIZE_TOKENS, block_hashes
from kvgate.vocabulary.value import frozen_value


@frozen_value
class RoutingRequest:
    model: str
    prompt_tokens: int
    max_output_tokens: int
    block_hashes: tuple[int, ...] = ()
    sequences: int = 1
    """Sequences the request runs at once (``n``, and each prompt of a batch): a slot each."""
    kv_bytes_per_token: int = 0
    """The model's KV bytes per token: what loading a cached block from a host tier moves; 0 when
    unknown (a host-tier hit then saves nothing)."""

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.max_output_tokens

    @classmethod
    def from_token_ids(
        cls, model: str, token_ids: Sequence[int], max_output_tokens: int, block_size: int = BLOCK_SIZE_TOKENS
    ) -> RoutingRequest:
        return cls(model, len(token_ids), max_output_tokens, tuple(block_hashes(token_ids, block_size)))
