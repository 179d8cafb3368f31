"""Whether a replica may receive traffic, from what its probes and its answers said.

A pure state machine per replica, fed by the edge with outcomes and the time: active ``/health``
probes and passive observations (connect errors, resets and 5xx other than 503 are failures; 429
and 503 are backpressure). A new replica is ``starting`` and never routable until
``healthy_threshold`` consecutive successes make it ``healthy``; that moment is its
``ready_since_s``, which starts its warm-up ramp. ``unhealthy_threshold`` consecutive failures eject
it for an exponential back-off (``base * 2 ** (ejections in a row - 1)``, capped at ``max``); while
ejected nothing it says counts. When the back-off has elapsed it is on probation, still without
traffic: one more failure ejects it again for twice as long, ``healthy_threshold`` successes (the
active probes') make it healthy and routable, and a replica that stays healthy for the longest
back-off loses its ejection streak. No request is sent to find out: a replica that accepts
connections and never answers would hold that request until its first-byte timeout. It returns as
a fresh replica (``ready_since_s`` is the success that made it healthy), since an ejected replica
has often restarted cold. Backpressure is not a failure: it only sets a short avoid window (the replica's
Retry-After, capped). Health never touches load: ``apply`` rewrites a view's health fields only, so
a probe cannot reset the reservations kvgate holds on a replica.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from kvgate.config.routing import RoutingConfig


class HealthState(StrEnum):
    STARTING = "starting"
    HEALTHY = "healthy"
    EJECTED = "ejected"


class Outcome(StrEnum):
    SUCCESS = "success"
    FAILURE = "failure"
    BACKPRESSURE = "backpressure"


def outcome_of_status(status_code: int | None) -> Outcome:
    """What an answer says about the replica; ``None`` is no answer (connect error, reset, timeout)."""
    if status_code is None:
        return Outcome.FAILURE
    if status_code in (429, 503):
        return Outcome.BACKPRESSURE
    if status_code >= 500:
        return Outcome.FAILURE
    return Outcome.SUCCESS


@dataclass(frozen=True, slots=True)
class HealthRules:
    unhealthy_threshold: int = 3
    healthy_threshold: int = 1
    ejection_backoff_base_s: float = 5.0
    ejection_backoff_max_s: float = 300.0
    backpressure_avoid_s: float = 1.0
    backpressure_avoid_max_s: float = 10.0

    @classmethod
    def from_config(
        cls, config: RoutingConfig, unhealthy_threshold: int, healthy_threshold: int
    ) -> HealthRules:
        """Back-off rules from the routing section; the thresholds from the ``health`` section."""
        return cls(
            unhealthy_threshold=unhealthy_threshold,
            healthy_threshold=healthy_threshold,
            ejection_backoff_base_s=config.ejection_backoff_base_s,
            ejection_backoff_max_s=config.ejection_backoff_max_s,
            backpressure_avoid_s=config.backpressure_avoid_s,
            backpressure_avoid_max_s=config.backpressure_avoid_max_s,
        )

    def backoff_s(self, ejections: int) -> float:
        return min(self.ejection_backoff_max_s, self.ejection_backoff_base_s * 2.0 ** (ejections - 1))


@dataclass(frozen=True, slots=True)
class ReplicaHealth:
    state: HealthState = HealthState.STARTING
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    ejections: int = 0
    """Ejections in a row; sets the next back-off."""
    ejected_until_s: float = 0.0
    avoid_until_s: float = 0.0
    ready_since_s: float | None = None

    def routable(self, now_s: float) -> bool:
        return self.state is HealthState.HEALTHY

    def observe(
        self, outcome: Outcome, now_s: float, rules: HealthRules, retry_after_s: float | None = None
    ) -> ReplicaHealth:
        if outcome is Outcome.SUCCESS:
            return self._success(now_s, rules)
        if outcome is Outcome.FAILURE:
            return self._failure(now_s, rules)
        avoid_s = min(rules.backpressure_avoid_max_s, retry_after_s or rules.backpressure_avoid_s)
        return replace(self, avoid_until_s=max(self.avoid_until_s, now_s + avoid_s))

    def _success(self, now_s: float, rules: HealthRules) -> ReplicaHealth:
        if self.state is HealthState.EJECTED and now_s < self.ejected_until_s:
            return self
        successes = self.consecutive_successes + 1
        if self.state is HealthState.HEALTHY:
            ready_since_s = self.ready_since_s if self.ready_since_s is not None else now_s
            streak_over = now_s - ready_since_s >= rules.ejection_backoff_max_s
            return replace(
                self,
                consecutive_failures=0,
                consecutive_successes=successes,
                ejections=0 if streak_over else self.ejections,
            )
        if successes < rules.healthy_threshold:
            return replace(self, consecutive_failures=0, consecutive_successes=successes)
        return replace(
            self,
            state=HealthState.HEALTHY,
            consecutive_failures=0,
            consecutive_successes=successes,
            ready_since_s=now_s,
        )

    def _failure(self, now_s: float, rules: HealthRules) -> ReplicaHealth:
        if self.state is HealthState.EJECTED and now_s < self.ejected_until_s:
            return self
        failures = self.consecutive_failures + 1
        on_probation = self.state is HealthState.EJECTED
        if self.state is HealthState.STARTING or (not on_probation and failures < rules.unhealthy_threshold):
            return replace(self, consecutive_failures=failures, consecutive_successes=0)
        ejections = self.ejections + 1
        return replace(
            self,
            state=HealthState.EJECTED,
            consecutive_failures=0,
            consecutive_successes=0,
            ejections=ejections,
            ejected_until_s=now_s + rules.backoff_s(ejections),
        )

    def view_fields(self, now_s: float) -> tuple[bool, float | None, float]:
        """A view's health fields from this state: ``healthy``, ``ready_since_s``, ``backoff_until_s``."""
        routable = self.routable(now_s)
        ready_since_s = None if self.state is HealthState.EJECTED else self.ready_since_s
        return routable, ready_since_s, max(self.avoid_until_s, self.ejected_until_s)


STARTING = ReplicaHealth()
"""The health of a replica never observed: one shared object, so it compares by identity."""


class HealthTracker:
    """Every replica's health, keyed by replica id; the edge's one mutable handle on the machine."""

    def __init__(self, rules: HealthRules) -> None:
        self._rules = rules
        self._health: dict[str, ReplicaHealth] = {}

    def observe(
        self, replica_id: str, outcome: Outcome, now_s: float, retry_after_s: float | None = None
    ) -> ReplicaHealth:
        health = self.get(replica_id).observe(outcome, now_s, self._rules, retry_after_s)
        self._health[replica_id] = health
        return health

    def get(self, replica_id: str) -> ReplicaHealth:
        health = self._health.get(replica_id)
        return STARTING if health is None else health

    @property
    def states(self) -> Mapping[str, ReplicaHealth]:
        """Every observed replica's health, by id, live (one never observed is ``STARTING``): for
        callers that read many replicas at once."""
        return self._health

    def remove(self, replica_id: str) -> None:
        self._health.pop(replica_id, None)
