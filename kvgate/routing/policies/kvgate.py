"""kvgate's policy: filters, then weighted scorers in [0, 1], then the best total (seeded ties).

Candidates pass the filters, then the cold-replica ramp keeps each with its slow-start probability,
then every scorer with a non-zero weight scores the survivors and the picker takes the highest
weighted sum. The prefix scorer reads what the policy measured once: blocks matched in the index,
the bounded-load limit, and the prefix's home, ranked by ``kvgate/routing/rendezvous.py`` over the request's
first ``prefix_home_key_tokens``. Above ``sample_size`` candidates the policy does not look at the
whole fleet: it scores ``sample_size`` seeded draws (with replacement; repeats merge) plus up to a
quarter of ``sample_size`` of the replicas holding the request's longest known prefix (found through
the index's hash-to-replica map, not a scan). Least-load choice over a small random sample balances
almost as well as over all (power of d choices) and keeps a decision's cost independent of fleet
size. Load, prefix match, the bounded-load limit and the home are measured over the scored
candidates only, so in a sampled fleet a prefix never routed before has no stable home; once routed,
the index's holders join the sample and keep it where its cache is.
If no sampled replica passes the filters, the whole fleet is filtered before the policy gives up,
so sampling never turns a routable request away.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvgate.config.routing import RoutingConfig
from kvgate.routing.decision import RoutingDecision, ScoreColumns
from kvgate.routing.filters import Gate
from kvgate.routing.load import load_ratios, within_bound
from kvgate.routing.picker import pick_best
from kvgate.routing.prefix_hash import BLOCK_SIZE_TOKENS
from kvgate.routing.prefix_index import PrefixIndex
from kvgate.routing.ramp import Ramp
from kvgate.routing.rendezvous import HomeRanking
from kvgate.routing.request import RoutingRequest
from kvgate.routing.scorers import SCORERS, Scorer, ScoringContext
from kvgate.routing.turnover import WriteRates
from kvgate.vocabulary.replica import ReplicaView

PREFIX_HOLDER_FULL = "prefix_holder_full"
"""No replica chosen: the ones holding the request's prefix are full and it may wait for them."""
SCAN_WRITER_FACTOR = 1.25
"""A candidate taking more than this multiple of the candidates' mean rate of blocks written by
prompts read once (``kvgate/routing/turnover.py``) gets no new prefix as its home: its cache turns over
fastest, so a prefix placed there would be evicted before its next use."""


class KvgatePolicy:
    def __init__(
        self, config: RoutingConfig, rng: random.Random, index: PrefixIndex, writes: WriteRates
    ) -> None:
        self._rng = rng
        self._index = index
        self._writes = writes
        self._scorers = tuple((name, SCORERS[name], w) for name, w in config.scorer_weights.items() if w > 0)
        self._uses_prefix = any(name == "prefix_locality" for name, _, _ in self._scorers)
        self._sample_size = config.sample_size
        self._stale_s = config.scrape_stale_s
        self._bounded_load_factor = config.bounded_load_factor
        self._holder_load_factor = max(config.holder_load_factor, config.bounded_load_factor)
        self._home_key_blocks = config.prefix_home_key_tokens // BLOCK_SIZE_TOKENS
        self._home_full_tokens = config.prefix_home_full_tokens
        self._scan_tokens = config.scan_prompt_tokens
        self._homes = HomeRanking()
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
        if (
            gate.now_s < gate.hold_until_s
            and self._uses_prefix
            and self._holder_is_full(request, window, passed, gate)
        ):
            return RoutingDecision(None, PREFIX_HOLDER_FULL)
        now_s = gate.now_s
        candidates = self._ramp.keep(passed, now_s, self._rng)
        slots = gate.slots
        token_shares, slot_shares = load_ratios(candidates, now_s, self._stale_s, slots)
        loads = [tokens + slots for tokens, slots in zip(token_shares, slot_shares, strict=True)]
        hashes = request.block_hashes
        home, home_score = -1, 0.0
        replica_ids = [view.replica_id for view in candidates]
        if self._uses_prefix and hashes:
            matched = self._index.match_each(replica_ids, hashes)
            kv_tokens, sequences = request.kv_tokens, request.sequences
            costs = [
                kv_tokens / view.kv_capacity_tokens + sequences / max(1, slots(view)) for view in candidates
            ]
            bounded = self._within_bound(loads, costs, matched)
            if 0 < self._home_key_blocks <= len(hashes):
                home, home_score = self._home(
                    request, candidates, replica_ids, matched, bounded, len(replicas), now_s
                )
        else:
            # Without a prefix to score, no scorer reads the bound: every candidate is inside it.
            matched = [0] * len(candidates)
            bounded = [True] * len(candidates)
        context = ScoringContext(now_s, token_shares, slot_shares, matched, bounded, home, home_score)
        parts = {name: scorer(request, candidates, context) for name, scorer, _ in self._scorers}
        totals = _weighted_sums(parts, self._scorers)
        chosen = pick_best(totals, self._rng)
        columns = ScoreColumns(replica_ids, totals, parts, loads, matched)
        affinity = self._uses_prefix and parts["prefix_locality"][chosen] > 0.0
        return RoutingDecision(
            candidates[chosen].replica_id, "prefix_affinity" if affinity else "least_load", columns
        )

    def _within_bound(
        self, loads: Sequence[float], costs: Sequence[float], matched: Sequence[int]
    ) -> list[bool]:
        """Whether each candidate may keep its prefix affinity: load within ``bounded_load_factor``
        x the mean, or within ``holder_load_factor`` x the mean for one already caching the
        request's prefix (at least the home key, one block without homes).

        A replica that only might be the prefix's home loses nothing by being passed over, but
        passing over the one that caches the prefix prefills it elsewhere and caches it twice,
        evicting another prefix there; on the routing lab's 64 system prompts over four replicas
        the tighter bound alone left a third to a half of them cached on two or three replicas.
        Admission's room filter still keeps a holder from taking more than fits.
        """
        bounded = within_bound(loads, costs, self._bounded_load_factor)
        if self._holder_load_factor == self._bounded_load_factor:
            return bounded
        holding = max(1, self._home_key_blocks)
        loose = within_bound(loads, costs, self._holder_load_factor)
        return [
            tight or (ok and held >= holding) for tight, ok, held in zip(bounded, loose, matched, strict=True)
        ]

    def _holder_is_full(
        self,
        request: RoutingRequest,
        window: Sequence[ReplicaView],
        passed: Sequence[ReplicaView],
        gate: Gate,
    ) -> bool:
        """Whether the request should wait for the replicas holding its longest known prefix.

        Only a prefix worth it (at least ``prefix_home_key_tokens``): placed elsewhere the request
        would prefill it again and cache it twice, evicting another prefix. It waits when no holder
        is among the replicas that may take it now and every holder it was shown lacks only room;
        a holder it was not shown at all was left out by admission for lack of room (an ejected
        or removed replica is forgotten by the index, so it is no holder).
        """
        key_blocks = max(1, self._home_key_blocks)
        hashes = request.block_hashes
        if len(hashes) < key_blocks:
            return False
        blocks, holders = self._index.longest_holders(hashes)
        if blocks < key_blocks:
            return False
        held = set(holders)
        if any(view.replica_id in held for view in passed):
            return False
        return all(gate.rejection(view) == "no_kv_room" for view in window if view.replica_id in held)

    def _home(
        self,
        request: RoutingRequest,
        candidates: Sequence[ReplicaView],
        replica_ids: Sequence[str],
        matched: Sequence[int],
        bounded: Sequence[bool],
        fleet_size: int,
        now_s: float,
    ) -> tuple[int, float]:
        """The prefix's home among ``candidates`` (whose ids are ``replica_ids``) and its score.

        Candidates above the load limit cannot be the home; if any within it already hold the key,
        the home is one of them, so a prefix spilled to its next home stays there while it is
        within the limit, and a replica joining the fleet does not pull prefixes from their cache.
        A hit saves at least the key's tokens if the prefix is shared at all, and the longest prefix
        the index knows some replica holds is shared by construction: the larger is the estimate of
        the prefill tokens saved.

        A prompt of at least ``scan_prompt_tokens`` whose key no replica is known to hold is taken
        as read once: its home is the candidate within the limit, with room for its worst-case KV
        beside kvgate's reservations there, taking the most blocks of such prompts, scored by the
        blocks it would evict elsewhere (its prompt's tokens, as a share of
        ``prefix_home_full_tokens``). Room counts even with admission off: there nothing else keeps
        documents from piling onto one replica until it preempts. A prefix no candidate within the
        limit holds gets no home on a candidate taking more than ``SCAN_WRITER_FACTOR`` x the mean
        of those blocks. In a fleet that also serves long one-off documents, they then fill as few
        replicas' caches as the load limit allows (each one taken raises that replica's rate, so it
        keeps them) and the shared prefixes the others', which turn over more slowly.
        """
        hashes = request.block_hashes
        key_blocks = self._home_key_blocks
        key = hashes[key_blocks - 1]
        longest_blocks = self._index.longest_blocks(hashes)
        home_score = min(1.0, max(key_blocks, longest_blocks) * BLOCK_SIZE_TOKENS / self._home_full_tokens)
        eligible = [i for i, held in enumerate(matched) if held >= key_blocks and bounded[i]]
        if eligible:
            return self._homes.home(key, replica_ids, eligible, fleet_size), home_score
        eligible = [i for i, ok in enumerate(bounded) if ok]
        if self._scan_tokens == 0 or len(eligible) < 2:
            return self._homes.home(key, replica_ids, eligible, fleet_size), home_score
        rates = self._writes.rates(replica_ids, now_s)
        if longest_blocks < key_blocks and request.prompt_tokens >= self._scan_tokens:
            kv_tokens = request.kv_tokens
            roomy = [
                i
                for i in eligible
                if candidates[i].kv_capacity_tokens - candidates[i].load.reserved_kv_tokens >= kv_tokens
            ]
            if not roomy:
                return self._homes.home(key, replica_ids, eligible, fleet_size), home_score
            top = max(rates[i] for i in roomy)
            writers = [i for i in roomy if rates[i] == top]
            scan_score = min(1.0, request.prompt_tokens / self._home_full_tokens)
            return self._homes.home(key, replica_ids, writers, fleet_size), scan_score
        limit = SCAN_WRITER_FACTOR * sum(rates) / len(rates)
        quiet = [i for i in eligible if rates[i] <= limit]
        return self._homes.home(key, replica_ids, quiet or eligible, fleet_size), home_score

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
