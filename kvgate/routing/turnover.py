"""How fast prompts read once fill each replica's KV cache: blocks written per second, decaying.

A vLLM replica's prefix cache evicts the least recently freed block whenever a request needs a
fresh one, so a cached prefix survives about as long as the replica takes to write a cache's worth
of new blocks. A long prompt nobody shares (a document read once) writes many blocks that will never
be hit, and wherever it lands it evicts prefixes that would have been. The router counts, for each
replica, the blocks such prompts were sent to write there (their prompt's blocks and one per 16
output tokens they may generate); the policy keeps the next such prompt on the replica already
taking the most, and new prefixes off the replicas taking more than their share, so the others'
caches turn over more slowly and keep their prefixes until a conversation's next turn comes back.

The rate is an exponentially decaying sum of writes over ``window_s`` (the sum divided by the
window), decayed lazily on each read or write from the injected ``now_s``: one multiply and one
``exp`` per replica touched, no timers. Invariant: a replica never written to reads 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class _Writes:
    blocks: float
    at_s: float


class WriteRates:
    def __init__(self, window_s: float = 30.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self._window_s = window_s
        self._by_replica: dict[str, _Writes] = {}

    def add(self, replica_id: str, blocks: int, now_s: float) -> None:
        """Count ``blocks`` written to ``replica_id`` at ``now_s``."""
        writes = self._by_replica.get(replica_id)
        if writes is None:
            self._by_replica[replica_id] = _Writes(float(blocks), now_s)
            return
        writes.blocks = self._decayed(writes, now_s) + blocks
        writes.at_s = max(writes.at_s, now_s)

    def rates(self, replica_ids: Sequence[str], now_s: float) -> list[float]:
        """Blocks per second each of ``replica_ids`` has been written lately (0 for one never written)."""
        by_replica = self._by_replica
        window_s = self._window_s
        rates = []
        for replica_id in replica_ids:
            writes = by_replica.get(replica_id)
            rates.append(0.0 if writes is None else self._decayed(writes, now_s) / window_s)
        return rates

    def forget(self, replica_id: str) -> None:
        self._by_replica.pop(replica_id, None)

    def _decayed(self, writes: _Writes, now_s: float) -> float:
        elapsed_s = now_s - writes.at_s
        if elapsed_s <= 0:
            return writes.blocks
        return writes.blocks * math.exp(-elapsed_s / self._window_s)
