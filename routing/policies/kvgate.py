"""kvgate's policy: filters, then weighted scorers in [0, 1], then the best total (seeded ties).

Candidates pass the filters, then the cold-replica ramp keeps each with its slow-start probability,
then every scorer with a non-zero weight scores the survivors and the picker takes the highest
weighted sum. Above ``sample_size`` candidates the policy does not look at the whole fleet: it
scores ``sample_size`` seeded draws (with replacement; repeats merge) plus up to a quarter of
``sample_size`` of the replicas holding the request's longest known prefix (found through the
index's hash-to-replica map, not a scan). Least-load choice over a small random sample balances
almost as well as over all (power of d choices) and keeps a decision's cost independent of fleet
size. Load, prefix match and the bounded-load limit are measured over the scored candidates only.
If no sampled replica passes the filters, the whole fleet is filtered before the policy gives up,
so sampling never turns a routable request away.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from config.routing import RoutingConfig
from routing.decision import RoutingDecision, ScoreColumns
from routing.filters import Gate
from routing.load import load_ratios, within_bound
from routing.picker import pick_best
from routing.prefix_index import PrefixIndex
from routing.ramp import Ramp
from routing.request import RoutingRequest
from routing.scorers import SCORERS, Scorer, ScoringContext
from vocabulary.replica import ReplicaView


class KvgatePolicy:
    def __init__(self, config: RoutingConfig, rng: random.Random, index: PrefixIndex) -> None:
        self._rng = rng
        self._index = index
        self._scorers = tuple((name, SCORERS[name], w) for name, w in config.scorer_weights.items() if w > 0)
        self._uses_prefix = any(name == "prefix_locality" for name, _, _ in self._scorers)
        self._sample_size = config.sample_size
        self._stale_s = config.scrape_stale_s
        self._bounded_load_factor = config.bounded_load_factor
        self._ramp = Ramp(config.warmup_s, config.min_ratio, config.aggression, config.cold_ttft_factor)
        self._positions: dict[str, int] = {}
        self._absent: set[str] = set()

    def pick(self, request: RoutingRequest, replicas: Sequence[ReplicaView], gate: Gate) -> RoutingDecision:
        window = self._window(request, replicas)
        passed, reason = gate.passing(window)
        if not passed and len(window) < len(replicas):
            passed, reason = gate.passing(replicas)
        if not passed:
            return RoutingDecision(None, reason)
        now_s = gate.now_s
        candidates = self._ramp.keep(passed, now_s, self._rng)
        loads = load_ratios(candidates, now_s, self._stale_s)
        hashes = request.block_hashes
        replica_ids = [view.replica_id for view in candidates]
        if self._uses_prefix and hashes:
            matched = self._index.match_each(replica_ids, hashes)
            kv_tokens = request.kv_tokens
            costs = [kv_tokens / view.kv_capacity_tokens for view in candidates]
            bounded = within_bound(loads, costs, self._bounded_load_factor)
        else:
            # Without a prefix to score, no scorer reads the bound: every candidate is inside it.
            matched = [0] * len(candidates)
            bounded = [True] * len(candidates)
        context = ScoringContext(now_s, loads, matched, bounded)
        parts = {name: scorer(request, candidates, context) for name, scorer, _ in self._scorers}
        totals = _weighted_sums(parts, self._scorers)
        chosen = pick_best(totals, self._rng)
        columns = ScoreColumns(replica_ids, totals, parts, loads, matched)
        affinity = self._uses_prefix and parts["prefix_locality"][chosen] > 0.0
        return RoutingDecision(
            candidates[chosen].replica_id, "prefix_affinity" if affinity else "least_load", columns
        )

    def _window(self, request: RoutingRequest, replicas: Sequence[ReplicaView]) -> Sequence[ReplicaView]:
        count = len(replicas)
        size = self._sample_size
        if size == 0 or count <= size:
            return replicas
        draw = self._rng.random
        positions = {int(draw() * count) for _ in range(size)}
        if self._uses_prefix and request.block_hashes:
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


def _weighted_sums(
    parts: dict[str, list[float]], scorers: Sequence[tuple[str, Scorer, float]]
) -> list[float]:
    """Each candidate's total: its scores times their weights, added in the scorers' order. A first
    scorer of weight 1 starts the totals as its own column (``1.0 * x == x``), shared, not copied:
    neither list changes after the decision."""
    name, _, weight = scorers[0]
    totals = parts[name] if weight == 1.0 else [weight * part for part in parts[name]]
    for name, _, weight in scorers[1:]:
        totals = [total + weight * part for total, part in zip(totals, parts[name], strict=True)]
    return totals
