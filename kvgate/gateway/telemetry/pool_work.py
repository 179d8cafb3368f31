"""What the gateway holds for each pool at one instant: queued, pending and resident work, and each
replica's KV occupancy and readiness.

Work is a *state*, not an event: the gateway reports it when asked, through ``PoolWorkSource``
(``kvgate/gateway/telemetry/fleet_work.py`` reads it off the queue and the reservations ledger), so what
``/metrics`` and ``/signals`` show is always current and returns to zero when nothing is in flight. These
values are what both exporters read; neither keeps a copy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from kvgate.vocabulary.replica import Role


@dataclass(frozen=True, slots=True)
class ReplicaWork:
    """One replica's state as the gateway sees it."""

    replica: str
    kv_capacity_tokens: int
    kv_occupancy_estimate_ratio: float
    """kvgate's reservations (prompt + max output per resident sequence) over capacity."""
    kv_occupancy_scraped_ratio: float | None
    """The replica's own ``vllm:kv_cache_usage_perc``; None when never scraped or stale."""
    ready: bool
    warming: bool = False
    """Ready but still inside the warm-up ramp (taking a reduced share of traffic)."""


@dataclass(frozen=True, slots=True)
class ModelWork:
    """Work for one model in one pool, in tokens and sequences."""

    model: str
    queued_requests: int = 0
    queued_prompt_tokens: int = 0
    """Prompt tokens of requests waiting in kvgate's admission queue."""
    pending_prompt_tokens: int = 0
    """Prompt tokens of admitted requests that have not produced a first token yet."""
    resident_sequences: int = 0
    remaining_decode_tokens: int = 0
    """Sum of ``max_output_tokens - produced`` over resident sequences: a worst-case bound."""


@dataclass(frozen=True, slots=True)
class PoolWork:
    pool: str
    role: Role
    models: tuple[ModelWork, ...] = ()
    replicas: tuple[ReplicaWork, ...] = ()

    def total(self, name: str) -> int:
        """Sum of one ``ModelWork`` field over the pool's models."""
        return sum(int(getattr(m, name)) for m in self.models)

    @property
    def kv_occupancy_estimate_ratio(self) -> float:
        return _weighted_occupancy(
            [(r.kv_capacity_tokens, r.kv_occupancy_estimate_ratio) for r in self.replicas]
        )

    @property
    def kv_occupancy_scraped_ratio(self) -> float | None:
        scraped = [
            (r.kv_capacity_tokens, r.kv_occupancy_scraped_ratio)
            for r in self.replicas
            if r.kv_occupancy_scraped_ratio is not None
        ]
        return _weighted_occupancy(scraped) if scraped else None


class PoolWorkSource(Protocol):
    """What the gateway reports about its pools at the instant it is asked."""

    def pool_work(self) -> Iterable[PoolWork]: ...


def _weighted_occupancy(pairs: list[tuple[int, float]]) -> float:
    capacity = sum(c for c, _ in pairs)
    return sum(c * r for c, r in pairs) / capacity if capacity > 0 else 0.0
