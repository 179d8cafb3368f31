"""What the autoscaling lab's loop is made of and makes: the settings of a run, what a scaler may
observe at an evaluation, each request's outcome, each replica's life, each evaluation, the run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bench.autoscale_lab.scenarios import Arrival
from kvgate.autoscaler.signals import PoolSignals
from kvgate.config.routing import RoutingConfig
from kvgate.sim.engine import Engine
from kvgate.sim.profile import Profile
from kvgate.vocabulary.replica import ScrapedMetrics


@dataclass(frozen=True, slots=True)
class Observation:
    """What a scaler may read at one evaluation: the gateway's signals and the three numbers the
    usual scalers use (ingress requests/s, the replicas' busy fraction, requests waiting)."""

    signals: PoolSignals
    requests_per_s: float
    busy_ratio: float
    """Mean over ready replicas of the share of the last interval the engine was stepping: the
    simulator's stand-in for GPU utilisation."""
    requests_waiting: int
    """Requests waiting anywhere: the replicas' ``num_requests_waiting`` plus kvgate's queue (without
    kvgate in front, the replicas would hold both)."""


Scaler = Callable[[Observation], int]
"""Desired replicas from one observation; the scaler keeps its own history."""


@dataclass(frozen=True, slots=True)
class LabSettings:
    profile: Profile
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    interval_s: float = 15.0
    signals_window_s: float = 60.0
    initial_replicas: int = 1
    min_replicas: int = 1
    max_replicas: int = 16
    max_queue_wait_s: float = 30.0
    head_of_line_max_wait_s: float = 5.0
    seed: int = 0


@dataclass(slots=True)
class Outcome:
    """One request's life as its client saw it."""

    arrival: Arrival
    first_token_s: float | None = None
    last_token_s: float | None = None
    tokens: int = 0
    refused: bool = False
    routed_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)

    def good(self, ttft_slo_s: float, itl_slo_s: float) -> bool:
        """The project's goodput (``RequestRecord.meets_slo``): served, TTFT and mean inter-token gap
        within target."""
        if self.refused or self.first_token_s is None or self.last_token_s is None:
            return False
        if self.first_token_s - self.arrival.arrival_s > ttft_slo_s:
            return False
        return self.tokens < 2 or (self.last_token_s - self.first_token_s) / (self.tokens - 1) <= itl_slo_s


@dataclass(slots=True)
class LabReplica:
    replica_id: str
    launched_s: float
    ready_s: float
    engine: Engine
    resident: dict[str, Outcome] = field(default_factory=dict)
    stepping: bool = False
    draining: bool = False
    removed_s: float | None = None
    scraped: ScrapedMetrics | None = None
    busy_mark_s: float = 0.0

    def ready(self, now_s: float) -> bool:
        return self.ready_s <= now_s and not self.draining and self.removed_s is None

    @property
    def live(self) -> bool:
        """Known to the gateway: neither draining nor removed (still starting counts)."""
        return not self.draining and self.removed_s is None


@dataclass(frozen=True, slots=True)
class Tick:
    time_s: float
    desired: int
    live: int
    ready: int


@dataclass(frozen=True, slots=True)
class LabRun:
    scaler: str
    outcomes: tuple[Outcome, ...]
    ticks: tuple[Tick, ...]
    replica_seconds: float
    preemptions: int
    spans: tuple[tuple[float, float], ...] = ()
    """(asked for, removed or the run's end) of each replica, clipped to the run."""

    def since(self, start_s: float) -> LabRun:
        """The run from ``start_s`` on: the requests that arrived and the evaluations made since,
        the replica-seconds spent since (a week's first day is history only)."""
        if start_s <= 0:
            return self
        return LabRun(
            self.scaler,
            tuple(o for o in self.outcomes if o.arrival.arrival_s >= start_s),
            tuple(t for t in self.ticks if t.time_s >= start_s),
            sum(max(0.0, end_s - max(start_s, begin_s)) for begin_s, end_s in self.spans),
            self.preemptions,
            tuple((max(start_s, b), e) for b, e in self.spans if e > start_s),
        )
