"""Baseline: each request to the next replica in fleet order that passes the filters.

No scoring, no ramp, no prefix affinity: the reference the replays measure the kvgate policy
against, and a fallback an operator can select. The cursor is a position in the snapshot, so a
fleet that grows or shrinks keeps rotating without a reset.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgate.routing.decision import RoutingDecision
from kvgate.routing.filters import FILTER_REASONS, NO_REPLICA, Gate
from kvgate.routing.request import RoutingRequest
from kvgate.vocabulary.replica import ReplicaView


class RoundRobinPolicy:
    def __init__(self) -> None:
        self._cursor = 0

    def pick(self, request: RoutingRequest, replicas: Sequence[ReplicaView], gate: Gate) -> RoutingDecision:
        count = len(replicas)
        furthest = -1
        for step in range(count):
            position = (self._cursor + step) % count
            reason = gate.rejection(replicas[position])
            if reason is None:
                self._cursor = position + 1
                return RoutingDecision(replicas[position].replica_id, "round_robin")
            furthest = max(furthest, FILTER_REASONS.index(reason))
        return RoutingDecision(None, FILTER_REASONS[furthest] if furthest >= 0 else NO_REPLICA)
