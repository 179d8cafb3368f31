"""vLLM's prefix-cache block hashes, as its KV cache events publish them.

vLLM (``--prefix-caching-hash-algo sha256``, the default) keys block ``i`` by
``sha256(pickle((parent, tuple(block_tokens), None)))``, protocol 5, ``parent`` being block ``i - 1``'s
whole digest or, for block 0, ``NONE_HASH = sha256(pickle(seed))`` where ``seed`` is the engine's
``PYTHONHASHSEED`` if set, else ``"vllm-none-hash"``. An event carries the digest's last eight bytes as
a big-endian uint64. Reproduced here byte for byte, so a gateway that tokenises as vLLM does can
predict every hash a simulated replica publishes.

The engine keys its own cache with cheap Python hashes of the same chains; ``BlockDigests`` maps
those keys to vLLM digests, computing only what it has not seen. It is shared by the replicas of a
fleet, which see the same system prompts again and again, so a prompt's digests cost their
sha256s once per process rather than once per request. Pure: no I/O, no clock; the seed is given.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from itertools import islice

DEFAULT_SEED = "vllm-none-hash"
PICKLE_PROTOCOL = 5
"""``pickle.HIGHEST_PROTOCOL`` on the Python vLLM runs on (3.11, 3.12)."""
DIGEST_CACHE_BLOCKS = 1 << 16
"""Digests remembered per fleet (about 13 MB); the oldest quarter goes when it is full."""


def none_hash(seed: str | None = None) -> bytes:
    """The parent of block 0: vLLM's ``NONE_HASH`` for ``seed`` (its ``PYTHONHASHSEED``, if set)."""
    return hashlib.sha256(pickle.dumps(DEFAULT_SEED if seed is None else seed, PICKLE_PROTOCOL)).digest()


def block_digest(parent: bytes, token_ids: tuple[int, ...]) -> bytes:
    """One block's digest, chained on its parent's whole digest (no LoRA, no salt, no media)."""
    return hashlib.sha256(pickle.dumps((parent, token_ids, None), PICKLE_PROTOCOL)).digest()


def published(digest: bytes) -> int:
    """The uint64 a KV event carries for ``digest`` (vLLM's default, int block hashes)."""
    return int.from_bytes(digest[-8:], "big")


def chain_digests(token_ids: Sequence[int], block_size: int, seed: str | None = None) -> list[bytes]:
    """Every full block's digest of a token sequence, from block 0."""
    parent = none_hash(seed)
    out: list[bytes] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_digest(parent, tuple(token_ids[start : start + block_size]))
        out.append(parent)
    return out


class BlockDigests:
    """vLLM digests of blocks, by the engine's own chained hash of the same block."""

    def __init__(self, seed: str | None = None, capacity_blocks: int = DIGEST_CACHE_BLOCKS) -> None:
        self.none_hash = none_hash(seed)
        self.capacity_blocks = capacity_blocks
        self._known: dict[int, bytes] = {}

    def __len__(self) -> int:
        return len(self._known)

    def chain(
        self, hashes: Sequence[int], start: int, stop: int, block_tokens: Callable[[int], tuple[int, ...]]
    ) -> tuple[bytes | None, list[bytes]]:
        """Digests of blocks ``start .. stop - 1`` of one chain (engine hashes ``hashes``), with the
        digest of block ``start - 1`` (``None`` at block 0). Blocks whose digest is unknown are computed
        from the nearest known ancestor, their tokens given by ``block_tokens(i)``."""
        known = self._known
        first = start
        while first > 0 and hashes[first - 1] not in known:
            first -= 1
        parent = known[hashes[first - 1]] if first > 0 else self.none_hash
        before = parent if start > 0 else None
        out: list[bytes] = []
        for index in range(first, stop):
            digest = known.get(hashes[index])
            if digest is None:
                digest = block_digest(parent, block_tokens(index))
                known[hashes[index]] = digest
            if index == start - 1:
                before = digest
            elif index >= start:
                out.append(digest)
            parent = digest
        if len(known) > self.capacity_blocks:
            for key in list(islice(known, self.capacity_blocks // 4)):
                del known[key]
        return before, out
