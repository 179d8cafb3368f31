"""Which prompt blocks kvgate last sent to which replica: an approximate, bounded prefix-cache map.

The index guesses what each replica's vLLM prefix cache holds from what kvgate routed there; it
never asks the replica. Each replica keeps at most ``capacity_blocks`` block hashes, and a reverse
map from block hash to the replicas holding it finds the replicas with the longest matching prefix
without scanning every replica. Recency is approximated with two generations (a two-handed clock):
blocks routed or re-used go to the ``recent`` generation; when it exceeds half the capacity, the
``old`` generation is forgotten and ``recent`` becomes ``old``. So a prompt that keeps coming back
costs one dictionary lookup to refresh, not a touch per block, and anything used within the last
half-capacity of new blocks survives. Invariant: each replica's set is prefix-closed (if block
``i`` of a chain is held, so is every block before it), because a chain's held head moves to
``recent`` together with it and trimming pops the most recently inserted block first, which is
never the parent of a held block. That makes "blocks matched before the first miss" monotone, so a
match is a binary search: O(log blocks) lookups per replica instead of a walk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import repeat

_Holders = str | set[str]
"""One holder is kept as its id: a one-element set costs ~200 bytes per block."""


class _Blocks:
    __slots__ = ("old", "recent", "written")

    def __init__(self) -> None:
        self.recent: dict[int, None] = {}
        self.old: dict[int, None] = {}
        self.written = 0
        """Blocks the replica was sent to write since ``recent`` began: new prompt and output blocks."""

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self.recent or block_hash in self.old

    def __len__(self) -> int:
        return len(self.recent) + len(self.old)


class PrefixIndex:
    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be > 0, got {capacity_blocks}")
        self._capacity_blocks = capacity_blocks
        self._by_replica: dict[str, _Blocks] = {}
        self._holders: dict[int, _Holders] = {}

    def record(
        self, replica_id: str, hashes: Sequence[int], output_blocks: int = 0, capacity_blocks: int = 0
    ) -> int:
        """Remember that the prompt with these chained block hashes was sent to ``replica_id``, which
        may generate ``output_blocks`` more and caches at most ``capacity_blocks`` (0: the index's
        own bound; a larger value counts as that bound); returns how many prompt blocks it was not
        known to hold (what it writes besides its output)."""
        blocks = self._by_replica.get(replica_id)
        if blocks is None:
            blocks = self._by_replica[replica_id] = _Blocks()
        capacity = self._capacity_blocks
        if 0 < capacity_blocks < capacity:
            capacity = capacity_blocks
        generation = max(1, capacity // 2)
        held = self.match_blocks(replica_id, hashes)
        if held and hashes[held - 1] not in blocks.recent:
            head = hashes[:held]
            deque(map(blocks.old.pop, head, repeat(None)), maxlen=0)
            blocks.recent.update(dict.fromkeys(head))
        new = hashes[held:]
        if new:
            blocks.recent.update(dict.fromkeys(new))
            holders = self._holders
            for h in new:
                current = holders.get(h)
                if current is None:
                    holders[h] = replica_id
                elif isinstance(current, set):
                    current.add(replica_id)
                elif current != replica_id:
                    holders[h] = {current, replica_id}
        blocks.written += len(new) + output_blocks
        if len(blocks.recent) > generation or blocks.written > generation:
            for h in blocks.old:
                self._drop_holder(h, replica_id)
            blocks.old, blocks.recent, blocks.written = blocks.recent, {}, 0
        while len(blocks) > capacity:
            h, _ = (blocks.old or blocks.recent).popitem()
            self._drop_holder(h, replica_id)
        return len(new)

    def match_blocks(self, replica_id: str, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` held by ``replica_id``, stopping at the first miss."""
        blocks = self._by_replica.get(replica_id)
        if not blocks or not hashes or hashes[0] not in blocks:
            return 0
        low, high = 1, len(hashes)
        while low < high:
            mid = (low + high + 1) // 2
            if hashes[mid - 1] in blocks:
                low = mid
            else:
                high = mid - 1
        return low

    def match_each(self, replica_ids: Sequence[str], hashes: Sequence[int]) -> list[int]:
        """``match_blocks`` for each replica; one not holding the first block costs a set lookup."""
        first = self._holders.get(hashes[0]) if hashes else None
        if first is None:
            return [0] * len(replica_ids)
        match = self.match_blocks
        if isinstance(first, str):
            return [match(replica_id, hashes) if replica_id == first else 0 for replica_id in replica_ids]
        return [match(replica_id, hashes) if replica_id in first else 0 for replica_id in replica_ids]

    def longest_blocks(self, hashes: Sequence[int]) -> int:
        """The longest prefix of ``hashes`` any replica holds, in blocks: what is known to be shared."""
        holders = self._holders
        low, high = 0, len(hashes)
        while low < high:
            mid = (low + high + 1) // 2
            if hashes[mid - 1] in holders:
                low = mid
            else:
                high = mid - 1
        return low

    def longest_holders(self, hashes: Sequence[int]) -> tuple[int, tuple[str, ...]]:
        """The longest prefix of ``hashes`` any replica holds, in blocks, and the replicas holding it
        (sorted, so a seeded picker decides the same whatever the process's string-hash seed)."""
        blocks = self.longest_blocks(hashes)
        if blocks == 0:
            return 0, ()
        held = self._holders[hashes[blocks - 1]]
        return blocks, (held,) if isinstance(held, str) else tuple(sorted(held))

    def remove_replica(self, replica_id: str) -> None:
        blocks = self._by_replica.pop(replica_id, None)
        if blocks is None:
            return
        for generation in (blocks.recent, blocks.old):
            for h in generation:
                self._drop_holder(h, replica_id)

    def holds(self, replica_id: str, block_hash: int) -> bool:
        blocks = self._by_replica.get(replica_id)
        return blocks is not None and block_hash in blocks

    def size_blocks(self, replica_id: str) -> int:
        blocks = self._by_replica.get(replica_id)
        return len(blocks) if blocks is not None else 0

    @property
    def replica_ids(self) -> frozenset[str]:
        return frozenset(self._by_replica)

    def _drop_holder(self, h: int, replica_id: str) -> None:
        held = self._holders.get(h)
        if isinstance(held, set):
            held.discard(replica_id)
            if len(held) == 1:
                self._holders[h] = next(iter(held))
        elif held == replica_id:
            del self._holders[h]
