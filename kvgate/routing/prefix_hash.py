"""Chained hashes of a prompt's full token blocks, as vLLM's prefix cache keys them.

Block ``i``'s hash covers the hash of block ``i - 1`` and block ``i``'s tokens, so equal hashes
mean equal prefixes up to that block, and a lookup can stop at the first miss. Only full blocks are
hashed: a partial last block is never shared. Integer tuples hash identically in every process, so
the gateway's index and the simulator's cache agree without a shared salt. A long prompt's ids can
be hashed run by run as they are counted (``BlockHasher``), so they need never be held all at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, islice

BLOCK_SIZE_TOKENS = 16
ROOT_HASH = 0x6B76_6761_7465
"""The parent of block 0: any fixed value."""


def chained(parent: int | None, block: tuple[int, ...]) -> int:
    """One block's hash from its parent's (None for a prompt's first block) and its own tokens: what
    ``block_hashes`` computes for each block, for hashes learnt a block at a time."""
    return hash((ROOT_HASH if parent is None else parent, block))


def block_hashes(token_ids: Sequence[int], block_size: int = BLOCK_SIZE_TOKENS) -> list[int]:
    """The blocks come as tuples from ``zip`` over one iterator: three times faster than slicing,
    which matters for a long prompt (a quarter of a million ids: 3 ms instead of 8)."""
    hashes: list[int] = []
    parent = ROOT_HASH
    for block in zip(*[iter(token_ids)] * block_size, strict=False):
        parent = hash((parent, block))
        hashes.append(parent)
    return hashes


class BlockHasher:
    """``block_hashes`` of ids given in consecutive runs: after ``add(a)``, ``add(b)``, ``hashes`` is
    ``block_hashes(a + b)``. A run's tokens past its last full block wait for the next run."""

    def __init__(self, block_size: int = BLOCK_SIZE_TOKENS) -> None:
        self.block_size = block_size
        self.hashes: list[int] = []
        self._pending: list[int] = []

    def add(self, token_ids: Sequence[int]) -> None:
        size = self.block_size
        blocks = (len(self._pending) + len(token_ids)) // size
        ids = chain(self._pending, token_ids)
        hashes = self.hashes
        parent = hashes[-1] if hashes else ROOT_HASH
        for block in islice(zip(*[ids] * size, strict=False), blocks):
            parent = hash((parent, block))
            hashes.append(parent)
        self._pending = list(ids)
