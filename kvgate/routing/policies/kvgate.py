"""kvgate's policy: filters, the cold-replica ramp, then placement by the prefill work left to do.

Candidates pass the filters, then the ramp keeps each with its slow-start probability, then each
survivor's work for the request is measured (``kvgate/routing/placement.py``): its backlog of
uncached prompt tokens plus the request's prompt less what its cache holds of it, read from the
replica's own KV events where it publishes them (``cache_index``) and from what kvgate routed there
where it does not (``prefix_index``), the same decision either way. The replica holding the longest
prefix that tells the candidates apart keeps the request while its backlog is within a TTFT
tolerance of the least; past that it goes where the work is least.

A request whose longest prefix is held only by replicas without room may wait for them, up to
``hold_until_s`` (``prefix_hold_s``): placed elsewhere it would prefill that prefix again and cache
it a second time, evicting another. Above ``sample_size`` candidates the policy looks at a seeded
sample of that many plus up to a quarter of ``sample_size`` of the replicas the prefix index knows
hold the request's prefix (found through its hash-to-replica map, not a scan): least-work choice over
a small sample balances almost as well as over all (power of d choices) and keeps a decision's cost
independent of the fleet's size. If no sampled replica passes the filters, the whole fleet is
filtered before the policy gives up.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvgate.config.routing import RoutingConfig
from kvgate.routing.cache_index import NO_MATCH, CacheIndex, Match
from kvgate.routing.decision import RoutingDecision, ScoreColumns
from kvgate.routing.filters import Gate
from kvgate.routing.load import load_ratios
from kvgate.routing.placement import Work, place
from kvgate.routing.prefix_index import PrefixIndex
from kvgate.routing.ramp import Ramp
from kvgate.routing.request import RoutingRequest
from kvgate.vocabulary.replica import ReplicaLoad, ReplicaView

PREFIX_HOLDER_FULL = "prefix_holder_full"
"""No replica chosen: the ones holding the request's prefix are full and it may wait for them."""


class KvgatePolicy:
    def __init__(
        self, config: RoutingConfig, rng: random.Random, index: PrefixIndex, cache: CacheIndex
    ) -> None:
        self._rng = rng
        self._index = index
        self._cache = cache
        self._block_tokens = config.block_size_tokens
        self._sample_size = config.sample_size
        self._stale_s = config.scrape_stale_s
        self._ttft_tolerance_s = config.ttft_tolerance_s
        self._affinity_min_tokens = config.affinity_min_tokens
        self._host_tier_bytes_per_s = config.host_tier_bytes_per_s
        self._decode_kv_weight = config.decode_kv_weight
        self._ramp = Ramp(config.warmup_s, config.min_ratio, config.aggression, config.cold_ttft_factor)
        self._positions: dict[str, int] = {}
        self._absent: set[str] = set()

    def pick(self, request: RoutingRequest, replicas: Sequence[ReplicaView], gate: Gate) -> RoutingDecision:
        window = self._window(request, replicas)
        passed, reason = gate.passing(window)
        if not passed and len(window) < len(replicas):
            window = replicas
            passed, reason = gate.passing(window)
        if not passed:
            return RoutingDecision(None, reason)
        now_s = gate.now_s
        holding = now_s < gate.hold_until_s and request.block_hashes
        if holding and self._holder_is_full(request, window, passed, gate):
            return RoutingDecision(None, PREFIX_HOLDER_FULL)
        candidates = self._ramp.keep(passed, now_s, self._rng)
        token_shares, slot_shares = load_ratios(candidates, now_s, self._stale_s, gate.slots)
        loads = [tokens + slots for tokens, slots in zip(token_shares, slot_shares, strict=True)]
        matches = [self._match(view.replica_id, request, now_s) for view in candidates]
        saving = self._host_saving(request, gate.prefill_tokens_per_s)
        kv_weight = self._decode_kv_weight
        works = [
            self._work(request, match, view.load, saving, kv_weight)
            for match, view in zip(matches, candidates, strict=True)
        ]
        bound_tokens = gate.prefill_tokens_per_s * self._ttft_tolerance_s
        chosen = place(works, loads, bound_tokens, self._affinity_min_tokens, self._rng)
        columns = ScoreColumns(
            [view.replica_id for view in candidates],
            [w.total_tokens for w in works],
            [w.cached_tokens for w in works],
            [w.backlog_tokens for w in works],
            loads,
        )
        cached = self._gpu_tokens(request, matches[chosen.index])
        return RoutingDecision(candidates[chosen.index].replica_id, chosen.reason, columns, cached)

    def _match(self, replica_id: str, request: RoutingRequest, now_s: float) -> Match:
        hashes = request.block_hashes
        if not hashes:
            return NO_MATCH
        if self._cache.follows(replica_id):
            return self._cache.match(replica_id, hashes, now_s)
        return Match(self._index.match_blocks(replica_id, hashes), 0)

    def _gpu_tokens(self, request: RoutingRequest, match: Match) -> int:
        """Prompt tokens the GPU tier serves: whole blocks, never the one holding the last token
        (vLLM computes it again to produce the first token)."""
        hittable = max(0, request.prompt_tokens - 1) // self._block_tokens
        return min(match.gpu_blocks, hittable) * self._block_tokens

    def _work(
        self,
        request: RoutingRequest,
        match: Match,
        load: ReplicaLoad,
        host_saving: float,
        kv_weight: float,
    ) -> Work:
        block = self._block_tokens
        gpu = self._gpu_tokens(request, match)
        hittable = max(0, request.prompt_tokens - 1) // block * block
        host = min(match.host_blocks * block, hittable - gpu) * host_saving
        cached = gpu + host
        decode = kv_weight * load.reserved_kv_tokens
        return Work(cached, request.prompt_tokens - cached, load.pending_uncached_tokens, decode)

    def _host_saving(self, request: RoutingRequest, prefill_tokens_per_s: float) -> float:
        """The share of a prompt token's prefill a host-tier hit saves: its computing time less the
        time its KV takes over the host link."""
        if request.kv_bytes_per_token <= 0 or prefill_tokens_per_s <= 0:
            return 0.0
        load_s = request.kv_bytes_per_token / self._host_tier_bytes_per_s
        return max(0.0, 1.0 - load_s * prefill_tokens_per_s)

    def _holder_is_full(
        self,
        request: RoutingRequest,
        window: Sequence[ReplicaView],
        passed: Sequence[ReplicaView],
        gate: Gate,
    ) -> bool:
        """Whether the request should wait for a replica holding its prefix: one that holds at
        least ``affinity_min_tokens`` more of it than any replica that may take it now, and lacks
        only room (it failed the room filter, or the caller left it out: admission found no room
        there). Holders are found through the index of what kvgate routed; how much each holds is
        read from its events where it publishes them. An ejected or removed replica is forgotten
        by that index, so it is no holder."""
        _, holders = self._index.longest_holders(request.block_hashes)
        if not holders:
            return False
        now_s = gate.now_s
        best_passed = max(
            self._gpu_tokens(request, self._match(view.replica_id, request, now_s)) for view in passed
        )
        allowed = {view.replica_id for view in passed}
        shown = {view.replica_id: view for view in window}
        for holder in holders:
            if holder in allowed:
                continue
            view = shown.get(holder)
            if view is not None and gate.rejection(view) != "no_kv_room":
                continue
            held = self._gpu_tokens(request, self._match(holder, request, now_s))
            if held - best_passed >= self._affinity_min_tokens:
                return True
        return False

    def _window(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> Sequence[ReplicaView]:
        count = len(replicas)
        size = self._sample_size
        if size == 0 or count <= size:
            return replicas
        draw = self._rng.random
        positions = {int(draw() * count) for _ in range(size)}
        if request.block_hashes:
            _, holders = self._index.longest_holders(request.block_hashes)
            most_holders = max(1, size // 4)
            if len(holders) > most_holders:
                # Oversample: a holder may be absent from this snapshot (ejected, removed).
                holders = tuple(self._rng.sample(holders, min(len(holders), 4 * most_holders)))
            added = 0
            for replica_id in holders:
                position = self._position(replicas, replica_id)
                if position is not None:
                    positions.add(position)
                    added += 1
                    if added == most_holders:
                        break
        return [replicas[position] for position in sorted(positions)]

    def _position(self, replicas: Sequence[ReplicaView], replica_id: str) -> int | None:
        """Where ``replica_id`` sits in this snapshot, or None when it is not in it.

        The id-to-position map is rebuilt only when a known id moved or an id is new since the
        last build; an id still absent after a build (a replica the edge has not yet told the
        router to forget, or one the caller left out) is remembered, so it cannot force a rebuild
        on every decision. Callers that keep their fleet snapshot in a stable order pay nothing.
        """
        position = self._positions.get(replica_id)
        if position is not None and position < len(replicas) and replicas[position].replica_id == replica_id:
            return position
        if position is None and replica_id in self._absent:
            return None
        self._positions = {view.replica_id: i for i, view in enumerate(replicas)}
        self._absent = set()
        position = self._positions.get(replica_id)
        if position is None:
            self._absent.add(replica_id)
        return position
