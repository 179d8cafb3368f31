"""The KV block pool with a prefix cache, as vLLM v1's block manager keeps it.

Blocks are integers ``0..num_blocks-1``. A block is either held (reference count > 0) or in the
free queue. Full blocks carry a chained hash (``kvgate.routing.prefix_hash``) and stay findable
after their request ends: freed blocks join the tail of an LRU free queue and keep their hash
until the queue hands them out again, so an idle cached block counts as free capacity yet can still
be hit. A lookup walks a prompt's hashes and stops at the first miss. Two blocks may hold the same
content (two requests computed the same prompt at once, or a prompt was recomputed up to its last
token): vLLM keeps both cached, announces each, and a lookup finds either; so does this pool.
Invariant: every block is either in the free queue or referenced, never both.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class BlockPool:
    def __init__(self, num_blocks: int, track_evictions: bool = False) -> None:
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}
        """Hash -> the block a lookup finds."""
        self._copies: dict[int, list[int]] = {}
        """Hash -> further blocks holding the same content (rare), found once the first is evicted."""
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.evicted: list[int] | None = [] if track_evictions else None
        """With ``track_evictions``: blocks whose cached content ``allocate`` dropped, for the caller
        to announce (their hashes are gone from the pool) and clear."""

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage_ratio(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def cached_prefix(self, hashes: Sequence[int]) -> list[int]:
        """Blocks holding the longest cached prefix of ``hashes`` (not yet referenced)."""
        hits: list[int] = []
        for block_hash in hashes:
            block = self._cached.get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cache-hit blocks, pulling idle ones out of the free queue."""
        for block in blocks:
            if self._ref[block] == 0:
                del self._free[block]
            self._ref[block] += 1

    def allocate(self, count: int) -> list[int] | None:
        """``count`` fresh blocks, evicting the least recently freed; ``None`` if too few are free."""
        if count > len(self._free):
            return None
        evicted = self.evicted
        blocks: list[int] = []
        for _ in range(count):
            block, _unused = self._free.popitem(last=False)
            if self._hash[block] is not None:
                self._uncache(block)
                if evicted is not None:
                    evicted.append(block)
            self._ref[block] = 1
            blocks.append(block)
        return blocks

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each block; tail blocks go first, so they are evicted first."""
        for block in reversed(blocks):
            self._ref[block] -= 1
            if self._ref[block] == 0:
                self._free[block] = None

    def register(self, block: int, block_hash: int) -> None:
        """Make a just-filled block findable by its chained hash."""
        self._hash[block] = block_hash
        first = self._cached.setdefault(block_hash, block)
        if first != block:
            self._copies.setdefault(block_hash, []).append(block)

    def cached_blocks(self) -> list[int]:
        """Every block that holds cached content, held or idle."""
        return [block for block, block_hash in enumerate(self._hash) if block_hash is not None]

    def reset(self) -> bool:
        """Forget every cached hash, as vLLM's ``reset_prefix_cache``; refused (False) while any
        block is held, since a running request's blocks cannot be uncached under it."""
        if len(self._free) != self.num_blocks:
            return False
        self._hash = [None] * self.num_blocks
        self._cached.clear()
        self._copies.clear()
        return True

    def _uncache(self, block: int) -> None:
        block_hash = self._hash[block]
        assert block_hash is not None
        self._hash[block] = None
        copies = self._copies.get(block_hash)
        if self._cached[block_hash] == block:
            if copies:
                self._cached[block_hash] = copies.pop()
            else:
                del self._cached[block_hash]
        elif copies is not None:
            copies.remove(block)
        if copies is not None and not copies:
            del self._copies[block_hash]
