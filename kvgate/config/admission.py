"""The admission section: what a request may cost, how long it may wait, what each tenant may spend.

Every field states its unit, default and an example. Models are frozen; cross-field checks run
after the field checks and report every problem at once (key, value, unit), so an operator fixes a
bad file in one pass. The admission core receives this section; who a request is (its key, and
whether one is required) is the auth section's, which only the tenant directory reads besides.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from kvgate.config.base import Frozen
from kvgate.config.tenants import TenantConfig


class MaxTokensPolicy(StrEnum):
    """What a request without ``max_tokens``/``max_completion_tokens`` gets: never "unbounded"."""

    REJECT = "reject"
    DEFAULT_CAP = "default_cap"


class ModelAdmissionConfig(Frozen):
    """Per-model output-cap policy. ``AdmissionConfig.default_model`` applies to models not listed.

    Model facts (context window, KV bytes per token, tokenizer, chat template) live once, in the
    top-level ``models[]``; the gateway passes them to ``kvgate.admission.cost`` with each request."""

    max_tokens_policy: MaxTokensPolicy = Field(
        default=MaxTokensPolicy.DEFAULT_CAP,
        description=(
            "When the request declares no max_tokens/max_completion_tokens (enum): 'reject' answers 400 "
            "asking the client to declare a cap; 'default_cap' applies default_max_tokens. "
            "Default 'default_cap'. Example: 'reject'."
        ),
    )
    default_max_tokens: int = Field(
        default=1024,
        gt=0,
        description="Output cap given to requests without one, under 'default_cap' (tokens). Default 1024. "
        "Example: 512.",
    )
    ttft_slo_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Time-to-first-token objective (seconds): a request is queued only while its expected "
            "wait plus its own prefill meets it, refused at once (429 `ttft_slo`, Retry-After when it "
            "would) when it would not, and refused when its place in the queue runs out; one that "
            "fits at once is always admitted. Default none (the queue limits alone). Example: 2."
        ),
    )
    itl_slo_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Inter-token-latency objective (seconds): each replica serving the model runs at most as "
            "many sequences as keep its predicted inter-token latency within it, the prediction a line "
            "learned per replica from its finished streams (kvgate.admission.itl_guard), never more than "
            "max_active_sequences_per_replica nor fewer than itl_guard_min_sequences; a replica "
            "serving several models keeps the tightest. Default none (the static guard alone). "
            "Example: 0.05."
        ),
    )


class DeadlineHeader(Frozen):
    name: str = Field(
        min_length=1,
        description="Request header carrying the client's timeout (name, lower case). No default. "
        "Example: 'x-request-timeout-ms'.",
    )
    unit: Literal["ms", "s"] = Field(
        description="Unit of the header's value (enum). No default. "
        "Example: 's' for x-stainless-read-timeout."
    )


_DEFAULT_DEADLINE_HEADERS = (
    DeadlineHeader(name="x-request-timeout-ms", unit="ms"),
    DeadlineHeader(name="x-stainless-read-timeout", unit="s"),
)


class AdmissionConfig(Frozen):
    enabled: bool = Field(
        default=True,
        description=(
            "Admit, queue or reject by KV cost (bool). Default true. false: every authenticated request is "
            "routed at once (a baseline for benchmarks; replicas may then preempt). Example: false."
        ),
    )
    anonymous_tenant: TenantConfig = Field(
        default_factory=lambda: TenantConfig(name="anonymous"),
        description="Tenant for requests without a known key while auth.enabled is off (section). "
        "Default: name 'anonymous', "
        "weight 1. Example: {name: public, weight: 0.5}.",
    )
    tenants: tuple[TenantConfig, ...] = Field(
        default=(),
        description="What each tenant named by auth.tenants may spend (list); a tenant not listed gets "
        "the defaults. Default empty. Example: [{name: search, weight: 2}].",
    )
    models: dict[str, ModelAdmissionConfig] = Field(
        default_factory=dict,
        description="Per-model cost rules keyed by served model name (map). Default empty. "
        "Example: {'meta-llama/Llama-3.1-8B-Instruct': {max_tokens_policy: reject}}.",
    )
    default_model: ModelAdmissionConfig = Field(
        default_factory=ModelAdmissionConfig,
        description="Cost rules for models not listed in 'models' (section). "
        "Default: the per-model defaults. "
        "Example: {max_tokens_policy: reject}.",
    )
    max_output_tokens_ceiling: int = Field(
        default=32768,
        gt=0,
        description="No request may ask for more output than this, whatever the model (tokens). "
        "Default 32768. Example: 4096.",
    )
    max_sequences_per_request: int = Field(
        default=128,
        gt=0,
        description=(
            "Most sequences one request may run: 'n' (or 'best_of') per prompt, times the prompts of a "
            "completions batch; above it the request is a 400 naming the field (count). Default 128, "
            "OpenAI's bound on 'n'. Example: 16."
        ),
    )
    max_active_sequences_per_replica: int = Field(
        default=128,
        gt=0,
        description=(
            "Inter-token-latency guard: admitted sequences per replica (count); with a model's "
            "itl_slo_s, the most the learned limit may allow. Default 128. Example: 64."
        ),
    )
    itl_guard_min_sequences: int = Field(
        default=1,
        gt=0,
        description=(
            "Fewest sequences a replica may run under a learned inter-token-latency limit, whatever "
            "the objective, so a slow replica still serves (count). Default 1. Example: 4."
        ),
    )
    max_queue_wait_s: float = Field(
        default=30.0,
        ge=0,
        description="Longest expected wait a request is queued for, absent a shorter client deadline "
        "(seconds). Default 30. Example: 10.",
    )
    queue_max_requests: int = Field(
        default=1024, ge=0, description="Queued requests at most (count). Default 1024. Example: 256."
    )
    queue_max_tokens: int = Field(
        default=4_000_000,
        ge=0,
        description="Queued prompt + max output tokens at most (tokens). Default 4000000. Example: 500000.",
    )
    head_of_line_max_wait_s: float = Field(
        default=5.0,
        ge=0,
        description=(
            "After this wait a queued request that does not fit stops smaller ones from bypassing it, so "
            "capacity is held for it (seconds). Default 5. Example: 2."
        ),
    )
    deadline_headers: tuple[DeadlineHeader, ...] = Field(
        default=_DEFAULT_DEADLINE_HEADERS,
        description="Headers read for the client's own timeout, first present wins (list). Default "
        "x-request-timeout-ms (ms), x-stainless-read-timeout (s). "
        "Example: [{name: x-deadline-ms, unit: ms}].",
    )
    retry_after_cap_s: float = Field(
        default=60.0,
        gt=0,
        le=120,
        description=(
            "Largest Retry-After sent (seconds). Older OpenAI/Anthropic SDKs honour at most 60 s and fall "
            "back to short backoff above it; current openai-python honours up to 120 s and gives up "
            "above. Default 60. Example: 30."
        ),
    )
    promise_grace_s: float = Field(
        default=2.0,
        gt=0,
        description=(
            "A request refused for capacity is promised a slot at its Retry-After; coming back (same "
            "tenant, same body) within this many seconds of that time claims the slot ahead of new "
            "arrivals of its class, and a slot not claimed by then is released (seconds). Default 2. "
            "Example: 1."
        ),
    )
    promise_max_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description=(
            "Largest share of the fleet's KV capacity set aside at once for promised slots that are "
            "due: returning clients go before new arrivals within this share, never with the whole "
            "fleet (fraction). Default 0.5. Example: 0.3."
        ),
    )
    no_replica_retry_after_s: float = Field(
        default=5.0,
        gt=0,
        description="Retry-After of a 503 when no replica is routable and none is due back sooner (seconds). "
        "Default 5. Example: 10.",
    )
    reservation_lease_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Lease of a reservation: the gateway renews the leases of requests still in flight every "
            "third of it, so a reservation whose request is gone (a bug, a lost release) is released "
            "this long after its last renewal, counted in kvgate_reservations_expired_total and "
            "logged (seconds). Default 60. Example: 30."
        ),
    )
    default_inter_token_s: float = Field(
        default=0.03,
        gt=0,
        description="Inter-token latency assumed until one is observed (seconds). Default 0.03. "
        "Example: 0.05.",
    )
    default_prefill_tokens_per_s: float = Field(
        default=8000.0,
        gt=0,
        description="Prefill rate per replica assumed until one is observed (tokens/s). Default 8000. "
        "Example: 20000.",
    )

    def model_rules(self, model: str) -> ModelAdmissionConfig:
        return self.models.get(model, self.default_model)

    @model_validator(mode="after")
    def _cross_checks(self) -> AdmissionConfig:
        problems: list[str] = []
        seen_names: set[str] = set()
        for tenant in self.tenants:
            if tenant.name in seen_names:
                problems.append(f"tenants: name {tenant.name!r} appears twice")
            seen_names.add(tenant.name)
        named_models = [(f"models.{name!r}", rules) for name, rules in self.models.items()]
        for where, rules in [("default_model", self.default_model), *named_models]:
            if rules.default_max_tokens > self.max_output_tokens_ceiling:
                problems.append(
                    f"{where}.default_max_tokens = {rules.default_max_tokens} tokens exceeds "
                    f"max_output_tokens_ceiling = {self.max_output_tokens_ceiling} tokens"
                )
        if self.itl_guard_min_sequences > self.max_active_sequences_per_replica:
            problems.append(
                f"itl_guard_min_sequences = {self.itl_guard_min_sequences} sequences exceeds "
                f"max_active_sequences_per_replica = {self.max_active_sequences_per_replica} sequences"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self
