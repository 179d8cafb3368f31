"""The routing section: which policy picks a replica, how the kvgate policy weighs a replica's cache
against its backlog, and how replicas are ramped, ejected and retried.

Frozen and strict like every section: an unknown key or an unknown policy fails at start-up and the
message lists the names that are known.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kvgate.config.base import Frozen

PolicyName = Literal["kvgate", "round_robin", "least_request"]


class RoutingConfig(Frozen):
    policy: PolicyName = Field(
        default="kvgate",
        description=(
            "How a replica is picked: 'kvgate' (filters, then where the prefill work left for the "
            "request is least, keeping it with the replica caching its prefix within ttft_tolerance_s), "
            "'round_robin' or 'least_request' (fewest resident sequences). Default kvgate. "
            "Example: round_robin"
        ),
    )
    block_size_tokens: int = Field(
        default=16,
        gt=0,
        description=(
            "Tokens per KV block on the replicas (vLLM's --block-size: 16 on GPUs by default, 128 on "
            "its CPU build): prompts are hashed in blocks of this size to match the replicas' prefix "
            "caches, and reservations are counted in whole blocks. Default 16. Example: 32"
        ),
    )
    ttft_tolerance_s: float = Field(
        default=0.5,
        ge=0,
        description=(
            "How much longer a request may wait for its first token on the replica caching its prefix "
            "than on the least busy one: it stays there while that replica's backlog of uncached "
            "prompt tokens exceeds the least backlog by at most the measured prefill rate times this, "
            "and goes where the prefill work left is least past it (s). Default 0.5. Example: 1"
        ),
    )
    affinity_min_tokens: int = Field(
        default=512,
        ge=0,
        description=(
            "Prompt tokens a replica's cache must hold beyond what the other candidates hold for it to "
            "keep the request within ttft_tolerance_s (and for a request to wait for it while it is "
            "full): a prefix every replica holds, or a few blocks more, decides nothing. "
            "Default 512. Example: 2048"
        ),
    )
    decode_kv_weight: float = Field(
        default=0.02,
        ge=0,
        description=(
            "Prompt tokens of load each KV token reserved by the sequences decoding on a replica "
            "weighs as: every decode step reads all of it and is slowed by every prompt prefilled "
            "beside it, so a replica busy decoding draws new work less than an idle one (ratio). "
            "Default 0.02 (one prompt token per 50 KV tokens). Example: 0.05"
        ),
    )
    host_tier_bytes_per_s: float = Field(
        default=25e9,
        gt=0,
        description=(
            "Rate at which a replica loads KV from its host-memory tier (vLLM's KV offloading), over "
            "PCIe: a prefix found there counts for the share of its prefill it saves, its computing "
            "time less its KV bytes over this rate (bytes/s). Default 25e9. Example: 50e9"
        ),
    )
    speculation_s: float = Field(
        default=10.0,
        ge=0,
        description=(
            "For a replica publishing KV events, how long a request's prompt blocks count as cached "
            "there after it was routed, before the replica's own events confirm them: keeps a burst "
            "of requests sharing a new prefix together (s). Default 10. Example: 5"
        ),
    )
    prefix_index_capacity_blocks: int | None = Field(
        default=None,
        gt=0,
        description=(
            "Most prompt blocks remembered per replica in the index of what kvgate routed there (read "
            "for replicas that publish no KV events); the least recently routed are forgotten first. "
            "Default none: twice the replica's KV cache, in blocks, which is what it may still hold "
            "(a few MB per replica; replicas that publish events need none). Example: 32768"
        ),
    )
    prefix_hold_s: float = Field(
        default=1.0,
        ge=0,
        description=(
            "Longest a request is kept waiting (queued at the gateway) for a replica caching its "
            "prompt's prefix (affinity_min_tokens more than the replicas with room) to have room, "
            "instead of being placed where it would prefill the prefix again and cache it twice; for "
            "a request already queued at most half of its wait budget, never for one holding a "
            "Retry-After promise; 0 disables. Default 1. Example: 0.5"
        ),
    )
    sample_size: int = Field(
        default=16,
        ge=0,
        description=(
            "With more candidates than this, the kvgate policy measures a seeded sample of this many "
            "plus the replicas holding the request's longest known prefix (power-of-d choices); 0 "
            "measures every candidate. Default 16. Example: 32"
        ),
    )
    scrape_stale_s: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds after which a replica's scraped /metrics no longer correct kvgate's own load "
            "accounting; if any candidate's scrape is older or missing, all are scored on kvgate's "
            "accounting alone. Default 10. Example: 5"
        ),
    )
    warmup_s: float = Field(
        default=60.0,
        ge=0,
        description=(
            "Seconds after a replica became ready during which its share of traffic ramps up; 0 "
            "disables the ramp. Default 60. Example: 120"
        ),
    )
    min_ratio: float = Field(
        default=0.1,
        gt=0,
        le=1.0,
        description=(
            "Smallest ramp weight (ratio) a cold replica gets, so a just-ready replica still sees "
            "traffic. Default 0.1. Example: 0.05"
        ),
    )
    aggression: float = Field(
        default=1.0,
        gt=0,
        description=(
            "Ramp curve exponent: weight = max(min_ratio, (t / warmup_s) ** (1 / aggression)); 1 is "
            "linear, above 1 rises faster early. Default 1. Example: 2"
        ),
    )
    cold_ttft_factor: float = Field(
        default=3.0,
        gt=1.0,
        description=(
            "A replica whose time-to-first-token average exceeds this multiple of the candidates' "
            "mean (and by more than 0.25 s) is treated as just ready (weight min_ratio). Default 3. "
            "Example: 4"
        ),
    )
    ejection_backoff_base_s: float = Field(
        default=5.0,
        gt=0,
        description=(
            "Seconds a replica stays ejected the first time; doubles with each ejection in a row. "
            "Default 5. Example: 10"
        ),
    )
    ejection_backoff_max_s: float = Field(
        default=300.0, gt=0, description="Longest ejection in seconds. Default 300. Example: 120"
    )
    backpressure_avoid_s: float = Field(
        default=1.0,
        ge=0,
        description=(
            "Seconds a replica that answered 429 or 503 is avoided when it gave no Retry-After "
            "(backpressure, not a failure: it is not ejected). Default 1. Example: 2"
        ),
    )
    backpressure_avoid_max_s: float = Field(
        default=10.0,
        ge=0,
        description=(
            "Cap in seconds on a replica's own Retry-After when avoiding it. Default 10. Example: 30"
        ),
    )
    retry_budget_ratio: float = Field(
        default=0.2,
        ge=0,
        description=(
            "Retries allowed as a fraction of requests in the budget window (ratio). "
            "Default 0.2. Example: 0.1"
        ),
    )
    retry_budget_floor: int = Field(
        default=3,
        ge=0,
        description=(
            "Retries always allowed in the budget window on top of the ratio, so a quiet gateway can "
            "still retry. Default 3. Example: 10"
        ),
    )
    retry_budget_window_s: float = Field(
        default=10.0,
        gt=0,
        description="Sliding window of the retry budget in seconds. Default 10. Example: 30",
    )
    max_retries: int = Field(
        default=2,
        ge=0,
        description=(
            "Most retries of one request, each on a replica not tried before and only before the "
            "first byte reached the client. Default 2. Example: 1"
        ),
    )
    seed: int = Field(
        default=0,
        description="Seed of the routing random source (tie-breaks, ramp, sampling). Default 0. Example: 42",
    )

    @model_validator(mode="after")
    def _consistent(self) -> RoutingConfig:
        if self.ejection_backoff_max_s < self.ejection_backoff_base_s:
            raise ValueError(
                f"ejection_backoff_max_s ({self.ejection_backoff_max_s} s) must be >= "
                f"ejection_backoff_base_s ({self.ejection_backoff_base_s} s)"
            )
        return self
