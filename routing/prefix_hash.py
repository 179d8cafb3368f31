"""Chained hashes of a prompt's full token blocks, as vLLM's prefix cache keys them.

Block ``i``'s hash covers the hash of block ``i - 1`` and block ``i``'s tokens, so equal hashes
mean equal prefixes up to that block, and a lookup can stop at the first miss. Only full blocks are
hashed: a partial last block is never shared. Integer tuples hash identically in every process, so
the gateway's index and the simulator's cache agree without a shared salt.
"""

from __future__ import annotations

from collections.abc import Sequence

BLOCK_SIZE_TOKENS = 16
_ROOT_HASH = 0x6B76_6761_7465  # any fixed value: the parent of block 0


def block_hashes(token_ids: Sequence[int], block_size: int = BLOCK_SIZE_TOKENS) -> list[int]:
    hashes: list[int] = []
    parent = _ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes
