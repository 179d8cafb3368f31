"""The routing section: which policy picks a replica, how its scorers weigh, and how replicas are
ramped, ejected and retried.

Frozen and strict like every section: an unknown key, an unknown policy or an unknown scorer name
fails at start-up and the message lists the names that are known. Scorer names live here, not in
``routing/``, because configuration may import nothing but pydantic; ``kvgate.routing.scorers`` keys its
registry by exactly these names and a unit test keeps the two in step.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from kvgate.config.base import Frozen

SCORER_NAMES: tuple[str, ...] = ("outstanding_tokens", "sequence_slots", "prefix_locality")
"""Every scorer a ``scorer_weights`` key may name."""

PolicyName = Literal["kvgate", "round_robin", "least_request"]


class RoutingConfig(Frozen):
    policy: PolicyName = Field(
        default="kvgate",
        description=(
            "How a replica is picked: 'kvgate' (filters, then the weighted scorers, then a seeded "
            "tie-break), 'round_robin' or 'least_request' (fewest resident sequences). "
            "Default kvgate. Example: round_robin"
        ),
    )
    scorer_weights: dict[str, float] = Field(
        default_factory=lambda: {"outstanding_tokens": 1.0, "sequence_slots": 1.0, "prefix_locality": 1.0},
        description=(
            "Weight of each scorer in the kvgate policy's sum, by name; each scorer gives [0, 1]; a "
            "scorer left out has weight 0. Known names: outstanding_tokens (free KV share), "
            "sequence_slots (free batch-slot share), prefix_locality. Default {outstanding_tokens: 1, "
            "sequence_slots: 1, prefix_locality: 1}. Example: {outstanding_tokens: 2}"
        ),
    )
    bounded_load_factor: float = Field(
        default=1.25,
        gt=1.0,
        description=(
            "Prefix affinity is ignored for a replica whose load exceeds this multiple of the "
            "candidates' mean load counting the request (ratio). Default 1.25. Example: 1.5"
        ),
    )
    holder_load_factor: float = Field(
        default=2.0,
        gt=1.0,
        description=(
            "Like bounded_load_factor, for a replica already caching the request's prefix (at least "
            "prefix_home_key_tokens of it): its affinity holds up to this multiple of the mean load, "
            "since sending the request elsewhere prefills and caches the prefix a second time; a "
            "value below bounded_load_factor counts as bounded_load_factor. Default 2. Example: 1.5"
        ),
    )
    prefix_home_key_tokens: int = Field(
        default=256,
        ge=0,
        description=(
            "Leading prompt tokens (whole 16-token blocks) whose hash gives a prefix its home "
            "replicas, so that prompts agreeing on them share a home; shorter prompts have no home "
            "and are placed by load; 0 disables homes. Long enough to tell system prompts apart past "
            "a common chat-template header. Default 256. Example: 512"
        ),
    )
    prefix_home_full_tokens: int = Field(
        default=2_048,
        gt=0,
        description=(
            "Prefill tokens a prefix-cache hit must save for a prefix's home to score the full "
            "prefix_locality 1 even before it holds the prefix; a shorter shared prefix scores in "
            "proportion, so it weighs less against load. Default 2048. Example: 1024"
        ),
    )
    scan_prompt_tokens: int = Field(
        default=0,
        ge=0,
        description=(
            "A prompt at least this long of which no replica is known to hold even the first "
            "prefix_home_key_tokens is taken as read once (a document): it goes to the replica "
            "within the load limit already taking the most such prompts' KV blocks, and prefixes "
            "not yet cached anywhere within the limit get their home elsewhere, so the other "
            "replicas' prefix caches turn over more slowly, at the cost of the documents' TTFT tail "
            "(they queue behind each other on fewer replicas); 0 disables. Default 0. Example: 4096"
        ),
    )
    prefix_index_capacity_blocks: int = Field(
        default=16_384,
        gt=0,
        description=(
            "Most prompt blocks (16 tokens each) remembered per replica in the prefix index (and "
            "never more than twice the replica's KV cache); the least recently routed are "
            "forgotten first. Default 16384. Example: 32768"
        ),
    )
    prefix_hold_s: float = Field(
        default=1.0,
        ge=0,
        description=(
            "Longest a request is kept waiting (queued at the gateway) for a replica that holds its "
            "prompt's prefix (at least prefix_home_key_tokens of it) to have room, instead of being "
            "placed on another with room, where it would prefill the prefix again and cache it "
            "twice; for a request already queued at most half of its wait budget, never for one "
            "holding a Retry-After promise; 0 disables. Default 1. Example: 0.5"
        ),
    )
    sample_size: int = Field(
        default=16,
        ge=0,
        description=(
            "With more candidates than this, the kvgate policy scores a seeded sample of this many "
            "plus the replicas holding the request's longest known prefix (power-of-d choices); 0 "
            "scores every candidate. Default 16. Example: 32"
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

    @field_validator("scorer_weights")
    @classmethod
    def _known_scorers(cls, weights: dict[str, float]) -> dict[str, float]:
        errors = [f"unknown scorer {name!r}" for name in weights if name not in SCORER_NAMES]
        errors += [f"scorer {name!r} weight {w} must be >= 0" for name, w in weights.items() if w < 0]
        if errors:
            raise ValueError("; ".join(errors) + f" (known scorers: {', '.join(SCORER_NAMES)})")
        return weights

    @model_validator(mode="after")
    def _consistent(self) -> RoutingConfig:
        if self.policy == "kvgate" and not any(w > 0 for w in self.scorer_weights.values()):
            raise ValueError(
                f"scorer_weights {self.scorer_weights} give the kvgate policy nothing to score: "
                f"give at least one of {', '.join(SCORER_NAMES)} a weight > 0"
            )
        if self.ejection_backoff_max_s < self.ejection_backoff_base_s:
            raise ValueError(
                f"ejection_backoff_max_s ({self.ejection_backoff_max_s} s) must be >= "
                f"ejection_backoff_base_s ({self.ejection_backoff_base_s} s)"
            )
        return self
