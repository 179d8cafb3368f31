"""The host-memory tier of vLLM's native KV offloading (``--kv-offloading-size``), by block hash.

vLLM's offloading connector copies every block it computes from the GPU to a pool of CPU blocks and,
when a request's prefix is missing on the GPU but present in that pool, loads it back over PCIe
instead of recomputing it. The CPU pool is an LRU of block hashes: a lookup that hits refreshes its
blocks, a store skips blocks already there and evicts the least recently used others to make room,
never one of the blocks it is storing. This is that pool's bookkeeping; the bytes never exist. Each
entry keeps the hash a KV event publishes for it (0 when events are off). Pure.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HostStore:
    """What one store did: the published hashes it added and those it evicted, in order."""

    stored: tuple[int, ...]
    evicted: tuple[int, ...]


class HostTier:
    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._blocks: OrderedDict[int, int] = OrderedDict()
        """Engine hash -> published hash, least recently used first."""

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def published_hashes(self) -> list[int]:
        return list(self._blocks.values())

    def cached_prefix(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes``, from the first, the tier holds; those become the most recent."""
        blocks = self._blocks
        count = 0
        for block_hash in hashes:
            if block_hash not in blocks:
                break
            blocks.move_to_end(block_hash)
            count += 1
        return count

    def store(self, hashes: Sequence[int], published: Sequence[int]) -> HostStore:
        """Copy blocks in; one that is already here is skipped. A store the tier cannot make room for
        is dropped whole, as vLLM's connector drops it."""
        blocks = self._blocks
        new = [(h, p) for h, p in zip(hashes, published, strict=True) if h not in blocks]
        if not new:
            return HostStore((), ())
        overflow = len(blocks) + len(new) - self.num_blocks
        victims: list[int] = []
        if overflow > 0:
            protected = set(hashes)
            for block_hash in blocks:
                if block_hash not in protected:
                    victims.append(block_hash)
                    if len(victims) == overflow:
                        break
            if len(victims) < overflow:
                return HostStore((), ())
        evicted = tuple(blocks.pop(victim) for victim in victims)
        for block_hash, value in new:
            blocks[block_hash] = value
        return HostStore(tuple(p for _h, p in new), evicted)
