"""Where one admitted request goes: the entry point the gateway calls for every routing decision.

``Router`` binds the configured policy, the seeded random source and what routing knows of the
replicas' caches: the index fed by their KV events (``cache_index``; the edge subscribes and hands
each event to ``cache``) and, for replicas publishing none, the index of what kvgate routed where
(``prefix_index``). ``choose`` takes the request, a snapshot of the fleet and the current time, and
returns a value: a replica id with the reason, or ``None`` with the binding filter as the reason. It
performs no I/O, reads no clock, draws only from the injected ``random.Random`` and records no
metrics; what it remembers is what it routed where (both indexes, the event-fed one speculatively
until the replica's events come). A retry passes the replicas already tried as ``exclude``; with
admission off the edge passes ``check_room=False`` (nothing is held back for room, the replicas queue
it). When a replica vanishes, is ejected or restarts, the edge calls ``forget`` so the prefixes kvgate
sent there go with it; its event stream, while it lasts, keeps saying what it really holds.
``slots`` is how many sequences each replica may run: admission's guard, so both count a replica full
alike; ``prefill_tokens_per_s`` is the replicas' measured prefill rate.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence

from kvgate.config.routing import RoutingConfig
from kvgate.routing.cache_index import CacheIndex
from kvgate.routing.decision import RoutingDecision
from kvgate.routing.filters import Gate
from kvgate.routing.policies.kvgate import KvgatePolicy
from kvgate.routing.policies.least_request import LeastRequestPolicy
from kvgate.routing.policies.round_robin import RoundRobinPolicy
from kvgate.routing.policy import Policy
from kvgate.routing.prefix_index import PrefixIndex
from kvgate.routing.request import RoutingRequest
from kvgate.vocabulary.capacity import own_slots
from kvgate.vocabulary.replica import ReplicaView
from kvgate.vocabulary.sharing import NOTHING_SHARED, ResidentPrefixes

CACHE_MEMORY_RATIO = 2
"""The index of what kvgate routed forgets a prefix sent to a replica once between one and two of
that replica's KV caches' worth of new blocks were sent there after it (its two generations each
hold one cache's worth). Not one: the replica frees a request's blocks, and only then may evict them,
when the request finishes, while the index counts them when it is routed, and its worst-case output
blocks with them. On the routing lab's many-prefix trace forgetting after one half to one cache lost
0.014 of hit rate against never forgetting within ``prefix_index_capacity_blocks`` (seeds 0-3), and
one to two gained 0.009 (seeds 0-7; 0.75 to 1.5 and 0.875 to 1.75 alike)."""


UNBOUNDED_BLOCKS = 1 << 62
"""The index's own bound when none is configured: each replica's is then its cache's
(``CACHE_MEMORY_RATIO``)."""


class Router:
    def __init__(self, config: RoutingConfig, rng: random.Random) -> None:
        self._config = config
        self._block_tokens = config.block_size_tokens
        self._index = PrefixIndex(config.prefix_index_capacity_blocks or UNBOUNDED_BLOCKS)
        self._cache = CacheIndex(config.block_size_tokens, config.speculation_s)
        self._cache_blocks: dict[str, int] = {}
        self._records_prefixes = config.policy == "kvgate"
        self._policy: Policy
        if config.policy == "kvgate":
            self._policy = KvgatePolicy(config, rng, self._index, self._cache)
        elif config.policy == "round_robin":
            self._policy = RoundRobinPolicy()
        else:
            self._policy = LeastRequestPolicy(rng)

    @property
    def config(self) -> RoutingConfig:
        return self._config

    @property
    def prefix_index(self) -> PrefixIndex:
        return self._index

    @property
    def cache(self) -> CacheIndex:
        """What the replicas publishing KV events hold; the edge feeds it their events."""
        return self._cache

    def choose(
        self,
        request: RoutingRequest,
        replicas: Sequence[ReplicaView],
        now_s: float,
        exclude: Collection[str] = frozenset(),
        check_room: bool = True,
        hold_until_s: float = float("-inf"),
        resident: ResidentPrefixes = NOTHING_SHARED,
        slots: Callable[[ReplicaView], int] = own_slots,
        prefill_tokens_per_s: float = 0.0,
    ) -> RoutingDecision:
        gate = Gate(request, now_s, exclude, check_room, hold_until_s, resident, slots, prefill_tokens_per_s)
        decision = self._policy.pick(request, replicas, gate)
        replica_id = decision.replica_id
        if replica_id is not None and self._records_prefixes and request.block_hashes:
            output_blocks = -(-request.max_output_tokens // self._block_tokens) * request.sequences
            capacity = self._cache_blocks.get(replica_id)
            if capacity is None:
                capacity = self._learn_cache_blocks(replica_id, replicas)
            self._index.record(replica_id, request.block_hashes, output_blocks, capacity)
            self._cache.speculate(replica_id, request.block_hashes, now_s)
        return decision

    def _learn_cache_blocks(self, replica_id: str, replicas: Sequence[ReplicaView]) -> int:
        """What the index remembers of ``replica_id`` at most: ``CACHE_MEMORY_RATIO`` x its KV
        cache's blocks, found once in the snapshot (a walk, so only on its first decision since it
        joined or was forgotten)."""
        for view in replicas:
            if view.replica_id == replica_id:
                blocks = CACHE_MEMORY_RATIO * view.kv_capacity_tokens // self._block_tokens
                self._cache_blocks[replica_id] = blocks
                return blocks
        return 0

    def hold_until_s(
        self, since_s: float, wait_budget_s: float = float("inf"), promised: bool = False
    ) -> float:
        """Until when a request that arrived (or queued) at ``since_s`` may wait for a full replica
        caching its prefix (pass as ``choose``'s ``hold_until_s``): ``prefix_hold_s`` after, within
        half of the wait budget it has; never for a request promised admission by a Retry-After."""
        if promised:
            return float("-inf")
        return since_s + min(self._config.prefix_hold_s, wait_budget_s / 2)

    def forget(self, replica_id: str) -> None:
        self._index.remove_replica(replica_id)
        self._cache_blocks.pop(replica_id, None)
