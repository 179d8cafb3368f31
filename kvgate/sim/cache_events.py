"""The KV cache events one engine step produces, in the order vLLM 0.32 publishes them.

vLLM gathers, per scheduler step, first its block pool's events in the order they happened — a
``BlockRemoved`` (one hash each) for every cached block an allocation evicted, then the
``BlockStored`` of the request that allocated, holding all of its blocks that this step fills, its
parent the hash of the block before them (``None`` at block 0) — and after them its offloading
connector's, for the host tier: a ``BlockRemoved`` of the blocks a store evicted, then the
``BlockStored`` of the blocks copied in (no tokens, no parent, ``block_size`` 0, ``medium`` ``CPU``).
A cache reset is an ``AllBlocksCleared`` that goes out with the next step. The log turns the engine's
own hashes into the published ones (``BlockDigests``) and remembers each GPU block's, so an eviction
announces what the store announced. Pure.

vLLM's connector sends host-tier hashes as raw digests (msgpack bin); these carry the same uint64
the GPU events carry, which is what a decoder reads either form as.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvgate.routing.kv_events import CPU, GPU, AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from kvgate.sim.host_tier import HostStore
from kvgate.sim.vllm_block_hash import BlockDigests, published


class CacheEventLog:
    def __init__(self, block_size: int, num_gpu_blocks: int, digests: BlockDigests) -> None:
        self.block_size = block_size
        self.digests = digests
        self._published_by_block = [0] * num_gpu_blocks
        self._events: list[KvEvent] = []
        self._host_events: list[KvEvent] = []

    def published_of(self, block: int) -> int:
        """The hash last announced for a GPU block's content."""
        return self._published_by_block[block]

    def stored(
        self,
        blocks: Sequence[int],
        hashes: Sequence[int],
        start: int,
        stop: int,
        token_ids: tuple[int, ...],
        block_tokens: Callable[[int], tuple[int, ...]],
    ) -> list[int]:
        """Announce blocks ``start .. stop - 1`` of a request as computed: ``blocks`` its GPU blocks,
        ``hashes`` its engine hashes, ``token_ids`` those blocks' tokens, ``block_tokens(i)`` any of
        its blocks' (an ancestor's digest may need computing); returns their published hashes."""
        size = self.block_size

        def tokens_of(index: int) -> tuple[int, ...]:
            if index < start:
                return block_tokens(index)
            offset = (index - start) * size
            return token_ids[offset : offset + size]

        parent, digests = self.digests.chain(hashes, start, stop, tokens_of)
        values = [published(d) for d in digests]
        by_block = self._published_by_block
        for offset, value in enumerate(values):
            by_block[blocks[start + offset]] = value
        parent_value = None if parent is None else published(parent)
        self._events.append(BlockStored(tuple(values), parent_value, token_ids, size, GPU))
        return values

    def evicted(self, blocks: Sequence[int]) -> None:
        """GPU blocks whose cached content an allocation dropped, leaf first as the free queue
        hands them out."""
        by_block = self._published_by_block
        self._events.extend(BlockRemoved((by_block[block],), GPU) for block in blocks)

    def host_stored(self, store: HostStore) -> None:
        if store.evicted:
            self._host_events.append(BlockRemoved(store.evicted, CPU))
        if store.stored:
            self._host_events.append(BlockStored(store.stored, None, (), 0, CPU))

    def cleared(self) -> None:
        self._events.append(AllBlocksCleared())

    def take(self) -> tuple[KvEvent, ...]:
        """This step's events, pool first then connector, and start the next step's."""
        if not self._events and not self._host_events:
            return ()
        events = (*self._events, *self._host_events)
        self._events.clear()
        self._host_events.clear()
        return events
