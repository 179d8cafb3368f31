"""What one request costs the fleet, worst case, before any replica sees it.

A request holds KV for its prompt plus every token it may generate, so its cost is
``prompt_tokens + max_output_tokens`` tokens of KV, times the model's KV bytes per token. The
output cap is never unbounded: a request without one gets the model's policy (reject with 400, or a
default cap), every cap is bounded by a global ceiling, and prompt + cap above the model's context
window is a 400 worded as vLLM words it. The model's facts (window, KV bytes per token) come from
the top-level ``models[]`` entry the edge passes in (``ModelFacts``); the admission section holds
only the output-cap policy. Invalid requests are values (``InvalidRequest``), not exceptions, so the
edge renders them as OpenAI errors in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from config.admission import AdmissionConfig, MaxTokensPolicy
from routing.value import frozen_value


@frozen_value
class CostEstimate:
    model: str
    prompt_tokens: int
    max_output_tokens: int
    kv_bytes_per_token: int

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.max_output_tokens

    @property
    def kv_bytes(self) -> int:
        return self.kv_tokens * self.kv_bytes_per_token


class ModelFacts(Protocol):
    """What cost needs to know about a model; ``config.schema.Model`` is one."""

    @property
    def max_model_len(self) -> int:
        """Context window: prompt + output tokens at most."""
        ...

    @property
    def kv_bytes(self) -> int:
        """KV cache bytes per token."""
        ...


@dataclass(frozen=True, slots=True)
class InvalidRequest:
    """A 400 the client can fix; ``param`` names the offending request field, as OpenAI errors do."""

    message: str
    param: str | None
    status: int = 400


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Keys and values (the 2) for every layer and KV head: Llama-3.1-8B in bf16 is 131072."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def requested_max_tokens(body: Mapping[str, Any]) -> int | InvalidRequest | None:
    """The output cap the client declared: ``max_completion_tokens`` first, then ``max_tokens``."""
    for param in ("max_completion_tokens", "max_tokens"):
        value = body.get(param)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return InvalidRequest(f"'{param}' must be a positive integer, got {value!r}.", param)
        return value
    return None


def estimate_cost(
    model: str, prompt_tokens: int, max_tokens: int | None, config: AdmissionConfig, facts: ModelFacts
) -> CostEstimate | InvalidRequest:
    """Apply the max_tokens policy, the global ceiling and the context window to one request."""
    rules = config.model_rules(model)
    window = facts.max_model_len
    if prompt_tokens >= window:
        return InvalidRequest(
            f"This model's maximum context length is {window} tokens. However, your request has "
            f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
            "messages",
        )
    if max_tokens is None:
        if rules.max_tokens_policy is MaxTokensPolicy.REJECT:
            return InvalidRequest(
                f"'max_tokens' or 'max_completion_tokens' is required for model '{model}': declare the "
                f"most tokens you want generated (at most {min(config.max_output_tokens_ceiling, window)}), "
                "so the server can reserve memory for the reply.",
                "max_tokens",
            )
        cap = min(rules.default_max_tokens, config.max_output_tokens_ceiling, window - prompt_tokens)
    else:
        if max_tokens > config.max_output_tokens_ceiling:
            return InvalidRequest(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This server "
                f"allows at most {config.max_output_tokens_ceiling} completion tokens per request.",
                "max_tokens",
            )
        if prompt_tokens + max_tokens > window:
            return InvalidRequest(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                f"maximum context length is {window} tokens and your request has {prompt_tokens} input "
                f"tokens ({max_tokens} > {window} - {prompt_tokens}).",
                "max_tokens",
            )
        cap = max_tokens
    return CostEstimate(model, prompt_tokens, cap, facts.kv_bytes)
