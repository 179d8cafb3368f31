"""Baseline: the replica with the fewest resident sequences, ties drawn from the seeded RNG.

Counts requests, not tokens, so a 30,000-token prompt weighs as much as a 50-token one: the
reference that shows what token-aware scoring adds. No ramp and no prefix affinity.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvgate.routing.decision import RoutingDecision
from kvgate.routing.filters import Gate
from kvgate.routing.picker import pick_best
from kvgate.routing.request import RoutingRequest
from kvgate.vocabulary.replica import ReplicaView


class LeastRequestPolicy:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, request: RoutingRequest, replicas: Sequence[ReplicaView], gate: Gate) -> RoutingDecision:
        passed, reason = gate.passing(replicas)
        if not passed:
            return RoutingDecision(None, reason)
        chosen = pick_best([-float(view.load.resident_sequences) for view in passed], self._rng)
        return RoutingDecision(passed[chosen].replica_id, "least_request")
