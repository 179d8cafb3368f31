"""The seam every routing policy implements: one method that picks a replica or says why none.

A policy sees the whole fleet snapshot and the filter chain bound to the request; it filters
(itself, so a policy can sample instead of filtering a thousand replicas), picks and returns a
``RoutingDecision``. Policies hold only their own decision state (a round-robin cursor); what a
decision teaches the fleet model (the prefix index) is recorded by the ``Router`` after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvgate.routing.decision import RoutingDecision
from kvgate.routing.filters import Gate
from kvgate.routing.request import RoutingRequest
from kvgate.vocabulary.replica import ReplicaView


class Policy(Protocol):
    def pick(
        self, request: RoutingRequest, replicas: Sequence[ReplicaView], gate: Gate
    ) -> RoutingDecision: ...
