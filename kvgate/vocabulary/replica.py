"""What the routing and admission decisions know about one replica at one instant.

A ``ReplicaView`` is a frozen snapshot assembled by the gateway from three sources: configuration
(pool, role, capacity), kvgate's own reservations ledger (updated synchronously at decision time,
so a burst never sees stale load) and the last scrape of the replica's vLLM ``/metrics`` (which
may be stale, hence its age). Decisions read views; they never mutate them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kvgate.vocabulary.value import frozen_value


class Role(StrEnum):
    MIXED = "mixed"
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class ScrapedMetrics:
    """The replica's own word on its state, from ``vllm:*`` gauges."""

    kv_cache_usage_ratio: float
    num_requests_running: int
    num_requests_waiting: int
    num_gpu_blocks: int | None
    block_size_tokens: int | None
    scraped_at_s: float
    kv_cache_size_tokens: int | None = None
    """vLLM's own count of the tokens its KV cache holds, where it reports one (a hybrid-attention
    model's capacity is not ``num_gpu_blocks x block_size``); None when it does not."""


@frozen_value
class ReplicaLoad:
    """kvgate's reservations on a replica: the work it has sent there and not yet seen finish."""

    pending_prompt_tokens: int = 0
    """Prompt tokens of admitted requests still waiting for their first token."""
    resident_sequences: int = 0
    """Admitted requests not yet finished (queued at the replica, prefilling or decoding)."""
    remaining_decode_tokens: int = 0
    """Sum over resident sequences of ``max_output_tokens - produced``: a worst-case bound."""
    reserved_kv_tokens: int = 0
    """Sum over resident sequences of ``prompt_tokens + max_output_tokens`` in whole KV blocks, less
    the shared prompt blocks counted once: the worst-case KV (``kvgate.admission.ledger``)."""
    pending_uncached_tokens: int = 0
    """Of ``pending_prompt_tokens``, those the replica's prefix cache was not expected to serve when
    each request was routed: the prefill work it has yet to do, which is what delays a first token."""

    @property
    def outstanding_tokens(self) -> int:
        return self.pending_prompt_tokens + self.remaining_decode_tokens


@frozen_value
class ReplicaView:
    replica_id: str
    url: str
    pool: str
    role: Role
    models: frozenset[str]
    kv_capacity_tokens: int
    max_sequences: int
    healthy: bool
    ready_since_s: float | None
    """When the replica first answered its health check after (re)appearing; None: not yet ready."""
    load: ReplicaLoad
    scraped: ScrapedMetrics | None = None
    ttft_ewma_s: float | None = None
    """Smoothed time to first token observed through kvgate, used to spot a replica still cold."""
    backoff_until_s: float = 0.0
    """Replica answered 429/503 or was ejected: avoid it until then."""
