"""What each replica's prefix cache holds, as the replica itself says: its KV cache events.

A replica publishing vLLM's KV events (``kv_events``) tells every block it stores and every block it
evicts, per tier: ``GPU``, and ``CPU`` for a host-memory tier it offloads to. This index follows
them, so routing reads what each cache holds now, evictions included, instead of guessing from
what was routed there (``prefix_index``, which stays for replicas that publish nothing).

Blocks are kept under the gateway's own chained hashes (``prefix_hash``), not vLLM's: a stored
block's hash is recomputed from its parent's and its tokens, which the event carries. vLLM's hash
depends on its hash algorithm and the seed of the replica's process; the gateway's depends on the
tokens alone, so the index is right whatever the replicas' ``--prefix-caching-hash-algo`` or
``PYTHONHASHSEED`` (a block whose parent the index never saw, after a gap in the events, cannot be
placed in a chain and is left out: the index then under-states a cache, never over-states it). The
event's vLLM hash maps to the gateway's for the block's removal, and for the host tier, whose
stores carry no tokens (vLLM's offloading connector copies blocks the GPU tier announced); blocks of
another size than the gateway hashes prompts with are not the same blocks and are left out too.
A tier may hold copies of a block (vLLM announces a block computed twice twice), so each tier counts
them and a block is gone from it with its last copy. A reset (``AllBlocksCleared``) clears the GPU
tier; the host tier keeps what it holds.

Between routing a request and the replica's events for it (its prefill must finish first) the
index holds *speculative* entries: the request's blocks, on the replica it was sent to, for
``speculation_s``. A burst of requests sharing a new prefix then follows the first instead of
prefilling it on every replica; an event for a block makes it real, and one that never comes
(the request failed) lets the guess lapse.

Matching a prompt is a binary search for the longest held prefix, which assumes a held block's
parent is held too: vLLM frees a request's blocks tail first and evicts the least recently freed,
so a chain loses its tail before its head. A match is ``(gpu_blocks, host_blocks)``: the leading
blocks in the GPU tier (or speculative), then the blocks after them found in the host tier, which
vLLM loads rather than computes. Pure: values in, values out, time passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvgate.routing.kv_events import CPU, GPU, AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from kvgate.routing.prefix_hash import chained


@dataclass(frozen=True, slots=True)
class Match:
    gpu_blocks: int = 0
    host_blocks: int = 0
    """Blocks after the GPU ones that the host tier holds."""


NO_MATCH = Match()


@dataclass(slots=True)
class _Cache:
    own: dict[int, int] = field(default_factory=dict)
    """vLLM's hash of each held block (either tier) -> the gateway's."""
    gpu: dict[int, int] = field(default_factory=dict)
    """The gateway's hash of each block the GPU tier holds -> its copies."""
    host: dict[int, int] = field(default_factory=dict)
    guessed: dict[int, float] = field(default_factory=dict)
    """Speculative blocks -> until when (the clock the index is given)."""

    def held(self, own: int) -> bool:
        return own in self.gpu or own in self.host


@dataclass(frozen=True, slots=True)
class Applied:
    """What one event did: blocks stored and removed, and blocks it could not place."""

    stored: int = 0
    removed: int = 0
    unlinked: int = 0
    """Stored blocks whose parent the index does not hold, or of another block size: left out."""
    cleared: bool = False


class CacheIndex:
    def __init__(self, block_size_tokens: int, speculation_s: float) -> None:
        self.block_size_tokens = block_size_tokens
        self.speculation_s = speculation_s
        self._caches: dict[str, _Cache] = {}
        self._lapses: deque[tuple[float, str, Sequence[int]]] = deque()
        """Speculative entries in the order they lapse, to drop them without a scan."""

    def follows(self, replica_id: str) -> bool:
        """The replica's events reach the index: its matches come from here."""
        return replica_id in self._caches

    def start(self, replica_id: str) -> None:
        """The replica's events are subscribed to (or began again after a gap): it holds nothing
        the index knows of until its events say so."""
        self._caches[replica_id] = _Cache()

    def forget(self, replica_id: str) -> None:
        self._caches.pop(replica_id, None)

    def apply(self, replica_id: str, event: KvEvent) -> Applied:
        cache = self._caches.get(replica_id)
        if cache is None:
            return Applied()
        if isinstance(event, BlockStored):
            return self._stored(cache, event)
        if isinstance(event, BlockRemoved):
            return self._removed(cache, event)
        if isinstance(event, AllBlocksCleared):
            host = cache.host
            self._caches[replica_id] = _Cache(
                {vllm: own for vllm, own in cache.own.items() if own in host}, {}, host, {}
            )
            return Applied(cleared=True)
        return Applied()

    def _stored(self, cache: _Cache, event: BlockStored) -> Applied:
        if not event.token_ids:
            return self._copied(cache, event)
        size = self.block_size_tokens
        if event.block_size != size:
            return Applied(unlinked=len(event.block_hashes))
        if event.parent_block_hash is None:
            parent: int | None = None
        else:
            parent = cache.own.get(event.parent_block_hash)
            if parent is None:
                return Applied(unlinked=len(event.block_hashes))
        tier = cache.host if event.medium == CPU else cache.gpu
        tokens = event.token_ids
        for i, vllm_hash in enumerate(event.block_hashes):
            own = chained(parent, tuple(tokens[i * size : (i + 1) * size]))
            cache.own[vllm_hash] = own
            tier[own] = tier.get(own, 0) + 1
            cache.guessed.pop(own, None)
            parent = own
        return Applied(stored=len(event.block_hashes))

    def _copied(self, cache: _Cache, event: BlockStored) -> Applied:
        """A store without tokens: blocks copied to a tier, known by the hashes the GPU tier gave."""
        tier = cache.host if event.medium == CPU else cache.gpu
        stored = unlinked = 0
        for vllm_hash in event.block_hashes:
            own = cache.own.get(vllm_hash)
            if own is None:
                unlinked += 1
                continue
            tier[own] = tier.get(own, 0) + 1
            stored += 1
        return Applied(stored=stored, unlinked=unlinked)

    def _removed(self, cache: _Cache, event: BlockRemoved) -> Applied:
        tier = cache.host if event.medium == CPU else cache.gpu
        removed = 0
        for vllm_hash in event.block_hashes:
            own = cache.own.get(vllm_hash)
            copies = tier.get(own, 0) if own is not None else 0
            if own is None or not copies:
                continue
            removed += 1
            if copies > 1:
                tier[own] = copies - 1
                continue
            del tier[own]
            if not cache.held(own):
                del cache.own[vllm_hash]
        return Applied(removed=removed)

    def speculate(self, replica_id: str, hashes: Sequence[int], now_s: float) -> None:
        """``hashes`` were just sent to ``replica_id``: count them held there until its events come,
        for at most ``speculation_s``."""
        cache = self._caches.get(replica_id)
        if cache is None or not hashes:
            return
        self._lapse(now_s)
        until_s = now_s + self.speculation_s
        guessed = cache.guessed
        gpu = cache.gpu
        for h in hashes:
            if h not in gpu:
                guessed[h] = until_s
        self._lapses.append((until_s, replica_id, hashes))

    def _lapse(self, now_s: float) -> None:
        lapses = self._lapses
        while lapses and lapses[0][0] <= now_s:
            until_s, replica_id, hashes = lapses.popleft()
            cache = self._caches.get(replica_id)
            if cache is None:
                continue
            guessed = cache.guessed
            for h in hashes:
                if guessed.get(h) == until_s:
                    del guessed[h]

    def match(self, replica_id: str, hashes: Sequence[int], now_s: float) -> Match:
        cache = self._caches.get(replica_id)
        if cache is None or not hashes:
            return NO_MATCH
        gpu, guessed = cache.gpu, cache.guessed

        def held(h: int) -> bool:
            return h in gpu or guessed.get(h, now_s) > now_s

        gpu_blocks = _leading(hashes, 0, held)
        host = cache.host
        if not host or gpu_blocks == len(hashes):
            return Match(gpu_blocks, 0)
        host_blocks = _leading(hashes, gpu_blocks, host.__contains__) - gpu_blocks
        return Match(gpu_blocks, host_blocks)

    def held_blocks(self, replica_id: str, medium: str = GPU) -> int:
        """Blocks the replica's events say its tier holds (speculative ones not counted)."""
        cache = self._caches.get(replica_id)
        if cache is None:
            return 0
        return len(cache.host if medium == CPU else cache.gpu)


def _leading(hashes: Sequence[int], start: int, contains: Callable[[int], bool]) -> int:
    """The end of the longest run of held blocks from ``start``, by binary search (a held block's
    parent is held)."""
    if start >= len(hashes) or not contains(hashes[start]):
        return start
    low, high = start + 1, len(hashes)
    while low < high:
        mid = (low + high + 1) // 2
        if contains(hashes[mid - 1]):
            low = mid
        else:
            high = mid - 1
    return low
