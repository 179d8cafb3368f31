"""Where one admitted request goes: the entry point the gateway calls for every routing decision.

``Router`` binds the configured policy, the seeded random source and the prefix index. ``choose``
takes the request, a snapshot of the fleet and the current time, and returns a value: a replica id
with the reason, or ``None`` with the binding filter as the reason. It performs no I/O, reads no
clock, draws only from the injected ``random.Random`` and records no metrics; the one thing it
remembers is what it routed where (the prefix index, updated for the kvgate policy when a replica
is chosen). A retry passes the replicas already tried as ``exclude``; with admission off the edge
passes ``check_room=False`` (nothing is held back for room, the replicas queue it). When a replica vanishes,
is ejected or restarts, the edge calls ``forget`` so its prefix entries go with it. ``slots`` is
how many sequences each replica may run: admission's guard, so both count a replica full alike.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence

from config.routing import RoutingConfig
from routing.decision import RoutingDecision
from routing.filters import Gate
from routing.policies.kvgate import KvgatePolicy
from routing.policies.least_request import LeastRequestPolicy
from routing.policies.round_robin import RoundRobinPolicy
from routing.policy import Policy
from routing.prefix_index import PrefixIndex
from routing.request import RoutingRequest
from vocabulary.capacity import own_slots
from vocabulary.replica import ReplicaView
from vocabulary.sharing import NOTHING_SHARED, ResidentPrefixes


class Router:
    def __init__(self, config: RoutingConfig, rng: random.Random) -> None:
        self._config = config
        self._index = PrefixIndex(config.prefix_index_capacity_blocks)
        self._records_prefixes = config.policy == "kvgate"
        self._policy: Policy
        if config.policy == "kvgate":
            self._policy = KvgatePolicy(config, rng, self._index)
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
    ) -> RoutingDecision:
        gate = Gate(request, now_s, exclude, check_room, hold_until_s, resident, slots)
        decision = self._policy.pick(request, replicas, gate)
        if decision.replica_id is not None and self._records_prefixes and request.block_hashes:
            self._index.record(decision.replica_id, request.block_hashes)
        return decision

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
