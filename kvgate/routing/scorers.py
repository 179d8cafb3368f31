"""How good each candidate is for one request, as a score in [0, 1] per scorer (higher is better).

Scorers are pure functions over a snapshot: the candidates, and a context holding what several
scorers share and the policy measured once (token and slot shares on one like-for-like metric,
prefix blocks matched in the index, and whether each candidate is within the bounded-load limit).
The policy adds them with the configured weights. ``outstanding_tokens`` is ``1 - token share`` and
``sequence_slots`` is ``1 - slot share`` (each capped at 0, ``kvgate/routing/load.py``): absolute, not
normalised across candidates, so a few tokens of difference cannot swing a whole point against
prefix locality. ``prefix_locality`` is the matched fraction of the request's blocks, and 0 for a
candidate whose load (both shares) is above the bounded-load limit (``bounded_load_factor`` x the
mean load counting this request; ``holder_load_factor`` for a replica already caching the prefix,
which a spill would duplicate), so one hot system prompt cannot pin all traffic to the replicas
that hold it: such a replica competes on load alone, where any candidate below the mean beats it. The
prefix's home (``kvgate/routing/rendezvous.py``, chosen by the policy within the same limit) scores at least
its home score: the prefill tokens a hit there saves, as a share of ``prefix_home_full_tokens``. So
distinct prefixes, even ones kvgate has never routed, partition across replicas instead of following
load, a long shared system prompt outweighs small load differences, and the home only breaks ties
among replicas that already hold the whole prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from kvgate.routing.request import RoutingRequest
from kvgate.vocabulary.replica import ReplicaView
from kvgate.vocabulary.value import frozen_value


@frozen_value
class ScoringContext:
    now_s: float
    load_ratios: Sequence[float]
    slot_ratios: Sequence[float]
    matched_blocks: Sequence[int]
    within_bound: Sequence[bool]
    home: int = -1
    """Position of the prefix's home among the candidates; -1 when the request has none."""
    home_score: float = 0.0


class Scorer(Protocol):
    def __call__(
        self, request: RoutingRequest, candidates: Sequence[ReplicaView], context: ScoringContext
    ) -> list[float]: ...


def outstanding_tokens(
    request: RoutingRequest, candidates: Sequence[ReplicaView], context: ScoringContext
) -> list[float]:
    return [1.0 - load if load < 1.0 else 0.0 for load in context.load_ratios]


def sequence_slots(
    request: RoutingRequest, candidates: Sequence[ReplicaView], context: ScoringContext
) -> list[float]:
    return [1.0 - slots if slots < 1.0 else 0.0 for slots in context.slot_ratios]


def prefix_locality(
    request: RoutingRequest, candidates: Sequence[ReplicaView], context: ScoringContext
) -> list[float]:
    total_blocks = len(request.block_hashes)
    if total_blocks == 0:
        return [0.0] * len(candidates)
    scores = [
        matched / total_blocks if allowed else 0.0
        for matched, allowed in zip(context.matched_blocks, context.within_bound, strict=True)
    ]
    home = context.home
    if home >= 0 and scores[home] < context.home_score:
        scores[home] = context.home_score
    return scores


SCORERS: Mapping[str, Scorer] = {
    "outstanding_tokens": outstanding_tokens,
    "sequence_slots": sequence_slots,
    "prefix_locality": prefix_locality,
}
