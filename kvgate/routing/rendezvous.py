"""Which candidate is a prompt prefix's home: rendezvous (highest-random-weight) hashing.

Every (prefix key, replica) pair gets a pseudo-random weight; a prefix's home is the eligible
candidate with the highest weight. So each prefix has a stable order over the replicas, distinct
prefixes spread evenly over them, and a replica joining or leaving moves only the prefixes whose
home it becomes or was (about 1/n of them), which is why the cache-aware routers partition prefixes
this way. The caller says which candidates may be the home (kvgate: those within the bounded-load
limit, and of those the ones already holding the prefix if any): when a prefix's home is too loaded,
the home is the next replica in that prefix's own order, not an arbitrary one, so a hot prefix
spills onto the same few replicas and its cache is duplicated as little as the load allows.

The weight of a pair is Fibonacci hashing of the prefix key xor the replica's key: one multiply per
candidate, identical in every process (CPython's tuple hash would be cheaper but orders replicas
far from uniformly: one replica of eight became home to a third of the prefixes). A replica's key
is a digest of its id (``str`` hashes are salted per process), computed once per id and kept while
the remembered ids are not many more than the fleet.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

_MASK = (1 << 64) - 1
_FIBONACCI = 0x9E37_79B9_7F4A_7C15
"""2**64 over the golden ratio: the product's high bits, which decide the comparison, depend on
every bit of the pair, so each prefix orders the replicas independently of other prefixes."""


def replica_key(replica_id: str) -> int:
    """A process-independent integer for ``replica_id`` (str ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(replica_id.encode(), digest_size=8).digest(), "big")


class HomeRanking:
    def __init__(self) -> None:
        self._keys: dict[str, int] = {}

    def home(
        self, prefix_key: int, replica_ids: Sequence[str], eligible: Iterable[int], fleet_size: int
    ) -> int:
        """Of the candidate positions ``eligible`` (into ``replica_ids``), the one first in
        ``prefix_key``'s order; -1 when none is eligible.

        ``fleet_size`` (the whole snapshot, of which the candidates may be a sample) bounds the ids
        remembered.
        """
        keys = self._keys
        if len(keys) > 2 * fleet_size + 64:
            # Ids of replicas long gone would otherwise accumulate; the live ones are recomputed once.
            keys.clear()
        best, best_weight = -1, 0
        for position in eligible:
            replica_id = replica_ids[position]
            key = keys.get(replica_id)
            if key is None:
                key = keys[replica_id] = replica_key(replica_id)
            weight = ((prefix_key ^ key) * _FIBONACCI) & _MASK
            if best < 0 or weight > best_weight:
                best, best_weight = position, weight
        return best
