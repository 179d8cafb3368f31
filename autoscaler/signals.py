"""One pool's signals at one instant: the autoscaling policy's only input.

A ``PoolSignals`` is a value stamped with the time its reader took it; the policy keeps a history of
them per pool and never asks where they came from (the gateway's ``/signals``, a simulation, a
test). Latencies are None when the window held no sample, which the policy reads as "no evidence of
slowness" rather than as zero work. Token counts are additive across heterogeneous requests, which
is why the policy sizes on them instead of on request counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from vocabulary.replica import Role


@dataclass(frozen=True, slots=True)
class PoolSignals:
    time_s: float
    pool: str
    role: Role
    replicas_current: int
    """Replicas that exist, cold-starting ones included."""
    replicas_ready: int
    kv_occupancy_ratio: float
    """Fraction of the pool's KV cache in use, 0..1 (capacity-weighted over replicas)."""
    ttft_p95_s: float | None
    itl_p95_s: float | None
    queue_wait_p95_s: float | None
    prompt_tokens_queued: int
    """Prompt tokens waiting for their first forward pass: queued in kvgate plus admitted and pending."""
    resident_sequences: int
    prompt_tokens_per_s: float
    output_tokens_per_s: float
