"""Which prompt blocks kvgate last sent to which replica: an approximate, bounded prefix-cache map.

The index guesses what each replica's vLLM prefix cache holds from what kvgate routed there; it
never asks the replica. Each replica keeps at most ``capacity_blocks`` block hashes in LRU order,
and a reverse map from block hash to the replicas holding it lets a lookup find the replicas with
the longest matching prefix without scanning every replica. Invariant: each replica's set is
prefix-closed (if block ``i`` of a chain is present, so is every block before it), because
``record`` touches a prompt's blocks deepest first, so a block is never less recently used than the
blocks after it and LRU eviction always takes a chain's tail first, as vLLM does. That makes "blocks
matched before the first miss" monotone, so a match is a binary search: O(log blocks) lookups per
replica instead of a walk.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

_Holders = str | set[str]
"""One holder is kept as its id: a one-element set costs ~200 bytes per block."""


class PrefixIndex:
    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks <= 0:
            raise ValueError(f"capacity_blocks must be > 0, got {capacity_blocks}")
        self._capacity_blocks = capacity_blocks
        self._by_replica: dict[str, OrderedDict[int, None]] = {}
        self._holders: dict[int, _Holders] = {}

    def record(self, replica_id: str, hashes: Sequence[int]) -> None:
        """Remember that the prompt with these chained block hashes was sent to ``replica_id``."""
        blocks = self._by_replica.get(replica_id)
        if blocks is None:
            blocks = self._by_replica[replica_id] = OrderedDict()
        holders = self._holders
        for h in reversed(hashes):
            if h in blocks:
                blocks.move_to_end(h)
                continue
            blocks[h] = None
            held = holders.get(h)
            if held is None:
                holders[h] = replica_id
            elif isinstance(held, set):
                held.add(replica_id)
            elif held != replica_id:
                holders[h] = {held, replica_id}
        while len(blocks) > self._capacity_blocks:
            evicted, _ = blocks.popitem(last=False)
            self._drop_holder(evicted, replica_id)

    def match_blocks(self, replica_id: str, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` held by ``replica_id``, stopping at the first miss."""
        blocks = self._by_replica.get(replica_id)
        if not blocks or not hashes:
            return 0
        low, high = 0, len(hashes)
        while low < high:
            mid = (low + high + 1) // 2
            if hashes[mid - 1] in blocks:
                low = mid
            else:
                high = mid - 1
        return low

    def longest_holders(self, hashes: Sequence[int]) -> tuple[int, tuple[str, ...]]:
        """The longest prefix of ``hashes`` any replica holds, in blocks, and the replicas holding it."""
        holders = self._holders
        low, high = 0, len(hashes)
        while low < high:
            mid = (low + high + 1) // 2
            if hashes[mid - 1] in holders:
                low = mid
            else:
                high = mid - 1
        if low == 0:
            return 0, ()
        held = holders[hashes[low - 1]]
        return low, (held,) if isinstance(held, str) else tuple(held)

    def remove_replica(self, replica_id: str) -> None:
        blocks = self._by_replica.pop(replica_id, None)
        if blocks is None:
            return
        for h in blocks:
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
