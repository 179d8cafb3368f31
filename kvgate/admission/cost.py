"""What one request costs the fleet, worst case, before any replica sees it.

A request holds KV for its prompts plus every token its sequences may generate, so its cost is
``prompt_tokens + sequences * max_tokens`` tokens of KV, times the model's KV bytes per token. The
work is read the way vLLM reads it on the request's route (``requested_work``): the output cap is
``max_completion_tokens or max_tokens`` on chat and ``max_tokens`` on completions; each prompt of a
completions batch is its own request; each prompt runs ``max(n, best_of)`` sequences that share its
prompt's KV (vLLM's prefix cache). ``n`` and ``best_of`` are bounded by configuration, and what
cannot be bounded before it runs (beam search, prompt embeddings) is refused. The output cap is
never unbounded: a request without one gets the model's policy (reject with 400, or a default cap),
every cap is bounded by a global ceiling, and each prompt + cap above the model's context window is
a 400 worded as vLLM words it. The body forwarded to the replica then says exactly the cap priced
(``capped_body``), so the replica cannot generate more than was reserved. The model's facts (window,
KV bytes per token) come from the top-level ``models[]`` entry the edge passes in (``ModelFacts``);
the admission section holds the output-cap policy and the bounds. Invalid requests are values
(``InvalidRequest``), not exceptions, so the edge renders them as OpenAI errors in one place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvgate.config.admission import AdmissionConfig, MaxTokensPolicy
from kvgate.vocabulary.value import frozen_value


@frozen_value
class CostEstimate:
    model: str
    prompt_tokens: int
    """Every prompt's tokens, each counted once (the sequences of one prompt share its KV)."""
    max_output_tokens: int
    """Every token the request may generate, across all its sequences: ``sequences * max_tokens``."""
    kv_bytes_per_token: int
    sequences: int = 1
    """Sequences the replica runs for it: prompts * ``max(n, best_of)``."""

    @property
    def max_tokens(self) -> int:
        """The output cap of each sequence: what the forwarded body says."""
        return self.max_output_tokens // self.sequences

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.max_output_tokens

    @property
    def kv_bytes(self) -> int:
        return self.kv_tokens * self.kv_bytes_per_token


class ModelFacts(Protocol):
    """What cost needs to know about a model; ``kvgate.config.models.Model`` is one."""

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


@frozen_value
class Requested:
    """What a request asks the replica to run, read as vLLM reads it on the request's route."""

    max_tokens: int | None
    """The output cap of each sequence; None when the client declared none."""
    sequences_per_prompt: int = 1
    """``max(n, best_of)``: the sequences vLLM runs for each prompt."""


def requested_max_tokens(body: Mapping[str, Any], chat: bool = True) -> int | InvalidRequest | None:
    """The output cap the route honours: on chat ``max_completion_tokens`` first, then ``max_tokens``
    (vLLM's ``max_completion_tokens or max_tokens``); on completions ``max_tokens`` only, since vLLM's
    completion request has no ``max_completion_tokens`` (the edge drops it from the forwarded body)."""
    for param in ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",):
        value = body.get(param)
        if value is None:
            continue
        if not _positive_int(value):
            return InvalidRequest(f"'{param}' must be a positive integer, got {value!r}.", param)
        return int(value)
    return None


def requested_work(
    body: Mapping[str, Any], chat: bool, prompts: int, config: AdmissionConfig
) -> Requested | InvalidRequest:
    """The cap and the sequences per prompt of a request, bounded with its ``prompts`` (the prompts
    the body carries, ``kvgate.admission.counting.batch_of``); a 400 for any field that multiplies work
    beyond the bound or cannot be priced before it runs."""
    if body.get("use_beam_search"):
        return InvalidRequest(
            "'use_beam_search' is not supported by this server: a beam search re-submits its beams at "
            "every step, so its work cannot be bounded before it runs. Use 'n' for several samples.",
            "use_beam_search",
        )
    if not chat and body.get("prompt_embeds") is not None:
        return InvalidRequest(
            "'prompt_embeds' is not supported by this server: their length in tokens cannot be "
            "counted before admission. Send the prompt as text or token ids.",
            "prompt_embeds",
        )
    max_tokens = requested_max_tokens(body, chat)
    if isinstance(max_tokens, InvalidRequest):
        return max_tokens
    bound = config.max_sequences_per_request
    per_prompt = 1
    if body.get("n") is not None or body.get("best_of") is not None:
        for param in ("n", "best_of"):
            value = body.get(param)
            if value is None:
                continue
            if not _positive_int(value):
                return InvalidRequest(f"'{param}' must be a positive integer, got {value!r}.", param)
            if value > bound:
                return InvalidRequest(
                    f"'{param}' is too large: {value}. This server runs at most {bound} sequences per "
                    "request.",
                    param,
                )
            per_prompt = max(per_prompt, value)
    if prompts * per_prompt > bound:
        return InvalidRequest(
            f"This request would run {prompts * per_prompt} sequences ({prompts} prompts * {per_prompt} "
            f"each); this server runs at most {bound} sequences per request. Send fewer prompts at once.",
            "prompt",
        )
    return Requested(max_tokens, per_prompt)


def capped_body(body: Mapping[str, Any], chat: bool, max_tokens: int) -> dict[str, Any] | None:
    """The body to forward so that the replica's cap is exactly ``max_tokens``, the cap priced; None
    when the client's body already says so (then its bytes go unchanged). On chat a body with one of
    ``max_completion_tokens``/``max_tokens`` keeps it; one with both or neither gets both set to the
    cap, so a replica of any version reads the same. On completions ``max_tokens`` is set and
    ``max_completion_tokens`` dropped, so the two can never disagree."""
    if chat:
        completion_cap, cap = body.get("max_completion_tokens"), body.get("max_tokens")
        if (completion_cap is None) != (cap is None) or completion_cap == cap == max_tokens:
            return None
        forwarded = dict(body)
        forwarded["max_completion_tokens"] = forwarded["max_tokens"] = max_tokens
        return forwarded
    if "max_completion_tokens" not in body and body.get("max_tokens") == max_tokens:
        return None
    forwarded = {p: v for p, v in body.items() if p != "max_completion_tokens"}
    forwarded["max_tokens"] = max_tokens
    return forwarded


def estimate_cost(
    model: str,
    prompt_tokens: int | Sequence[int],
    max_tokens: int | None,
    config: AdmissionConfig,
    facts: ModelFacts,
    sequences_per_prompt: int = 1,
) -> CostEstimate | InvalidRequest:
    """Apply the max_tokens policy, the global ceiling and the context window to one request.

    ``prompt_tokens`` is the prompt's length, or each prompt's length for a completions batch: every
    prompt must fit the window with the cap, and each runs ``sequences_per_prompt`` sequences."""
    lengths = [prompt_tokens] if isinstance(prompt_tokens, int) else list(prompt_tokens)
    longest = max(lengths, default=0)
    rules = config.model_rules(model)
    window = facts.max_model_len
    if longest >= window:
        return InvalidRequest(
            # "at least", as vLLM words it: counting stops once a prompt reaches the window.
            f"This model's maximum context length is {window} tokens. However, your request has at "
            f"least {longest} input tokens. Please reduce the length of the input messages.",
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
        cap = min(rules.default_max_tokens, config.max_output_tokens_ceiling, window - longest)
    else:
        if max_tokens > config.max_output_tokens_ceiling:
            return InvalidRequest(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This server "
                f"allows at most {config.max_output_tokens_ceiling} completion tokens per request.",
                "max_tokens",
            )
        if longest + max_tokens > window:
            return InvalidRequest(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                f"maximum context length is {window} tokens and your request has {longest} input "
                f"tokens ({max_tokens} > {window} - {longest}).",
                "max_tokens",
            )
        cap = max_tokens
    sequences = len(lengths) * sequences_per_prompt
    return CostEstimate(model, sum(lengths), sequences * cap, facts.kv_bytes, sequences)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
