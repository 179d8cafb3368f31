"""Hardware-and-model profiles: the numbers a simulated replica's cost model runs on.

A profile fixes the KV capacity (in tokens, cut into blocks) and its host-memory tier, the scheduler limits
(``max_num_seqs``, ``max_num_batched_tokens``, ``max_model_len``), the roofline constants that turn
one engine step into seconds, the cold start and warm-up, and the distribution of natural output
lengths. Every field can be overridden by name; an unknown name or a bad value fails at once with
all problems listed, so a typo never silently runs the default.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    kv_capacity_tokens: int
    block_size_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    # Roofline: step_s = t_fixed_s + seqs * seq_overhead_s + max(compute_s, memory_s), times the
    # warm-up factor.
    t_fixed_s: float
    weights_bytes: float
    kv_bytes_per_token: int
    flops_per_token: float
    attention_flops_per_token_ctx: float
    peak_flops: float
    mfu_ratio: float
    hbm_bytes_per_s: float
    hbm_efficiency_ratio: float
    cold_start_s: float
    warmup_s: float
    warmup_factor: float
    # Natural output length: lognormal with this median and sigma, clipped to [1, max_tokens].
    output_len_median_tokens: float
    output_len_sigma: float
    # Disaggregated serving: the link a decode instance pulls a prompt's KV over, and how long a
    # prefill instance keeps KV no decode instance pulled (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT).
    kv_link_bytes_per_s: float = 50e9
    kv_transfer_timeout_s: float = 480.0
    # vLLM's native KV offloading (--kv-offloading-size): a host-memory tier of this many tokens (0: off)
    # that every computed block is copied to, and the rate a prefix found only there is loaded back at.
    # 25 GB/s: an H100's PCIe Gen5 x16 host link peaks at 64 GB/s a direction and moves about 50 GB/s
    # of large pinned copies; vLLM's copies are per block (0.5-2 MB each since 0.12) and share the link
    # with other traffic, and a Gen4 host caps it at about 25 GB/s. Half the Gen5 figure is the
    # conservative middle: a load of Llama-3.1-8B's KV runs ~6x faster than recomputing the prefix.
    cpu_offload_tokens: int = 0
    cpu_offload_bytes_per_s: float = 25e9
    # Costs a fitted profile (``kvgate sim calibrate``) measures that a GPU's roofline leaves out: per
    # scheduled sequence per step (sampling, bookkeeping; large on a CPU), and the front end's latency
    # before a request can be scheduled (tokenisation, hand-off to the engine), seconds of wall time.
    seq_overhead_s: float = 0.0
    frontend_latency_s: float = 0.0

    @property
    def num_gpu_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size_tokens

    @property
    def num_cpu_blocks(self) -> int:
        return self.cpu_offload_tokens // self.block_size_tokens


_LLAMA_8B_H100 = Profile(
    name="llama-3.1-8b-h100",
    kv_capacity_tokens=450_000,
    block_size_tokens=16,
    max_num_seqs=256,
    max_num_batched_tokens=8192,
    max_model_len=131_072,
    t_fixed_s=0.0005,
    weights_bytes=16.06e9,
    kv_bytes_per_token=131_072,
    flops_per_token=2 * 8.03e9,
    attention_flops_per_token_ctx=4 * 32 * 4096,
    peak_flops=989e12,
    mfu_ratio=0.5,
    hbm_bytes_per_s=3.35e12,
    hbm_efficiency_ratio=0.8,
    cold_start_s=60.0,
    warmup_s=30.0,
    warmup_factor=1.5,
    output_len_median_tokens=200.0,
    output_len_sigma=0.9,
)

_LLAMA_70B_4XH100 = dataclasses.replace(
    _LLAMA_8B_H100,
    name="llama-3.1-70b-4xh100",
    kv_capacity_tokens=420_000,
    t_fixed_s=0.002,
    weights_bytes=141.1e9,
    kv_bytes_per_token=327_680,
    flops_per_token=2 * 70.6e9,
    attention_flops_per_token_ctx=4 * 80 * 8192,
    peak_flops=4 * 989e12,
    mfu_ratio=0.45,
    hbm_bytes_per_s=4 * 3.35e12,
    hbm_efficiency_ratio=0.75,
    cold_start_s=180.0,
    warmup_s=60.0,
)

PROFILES: dict[str, Profile] = {p.name: p for p in (_LLAMA_8B_H100, _LLAMA_70B_4XH100)}
DEFAULT_PROFILE = _LLAMA_8B_H100.name


def resolve_profile(name: str = DEFAULT_PROFILE, overrides: Mapping[str, Any] | None = None) -> Profile:
    """The named profile with ``overrides`` applied; raises ``ValueError`` listing every problem."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(sorted(PROFILES))}")
    base = PROFILES[name]
    fields = {f.name: f for f in dataclasses.fields(Profile)}
    errors: list[str] = []
    changes: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if key not in fields or key == "name":
            errors.append(f"unknown profile field {key!r}")
            continue
        kind = type(getattr(base, key))
        try:
            converted = kind(value)
        except (TypeError, ValueError):
            errors.append(f"{key}={value!r}: expected {kind.__name__}")
            continue
        if converted < 0 or (converted == 0 and key in _POSITIVE):
            errors.append(f"{key}={value!r}: must be {'> 0' if key in _POSITIVE else '>= 0'}")
            continue
        changes[key] = converted
    if errors:
        raise ValueError("; ".join(errors))
    profile = dataclasses.replace(base, **changes)
    if profile.kv_capacity_tokens < profile.block_size_tokens:
        raise ValueError(
            f"kv_capacity_tokens={profile.kv_capacity_tokens} is below one block "
            f"({profile.block_size_tokens} tokens)"
        )
    return profile


_POSITIVE = frozenset(
    {
        "kv_capacity_tokens",
        "block_size_tokens",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_model_len",
        "peak_flops",
        "mfu_ratio",
        "hbm_bytes_per_s",
        "hbm_efficiency_ratio",
        "output_len_median_tokens",
        "kv_link_bytes_per_s",
        "cpu_offload_bytes_per_s",
    }
)


def step_duration_s(
    profile: Profile, tokens: int, attention_ctx_tokens: float, kv_read_tokens: int, seqs: int = 0
) -> float:
    """Seconds one engine step takes, before warm-up: fixed overhead, a cost per scheduled sequence,
    plus the slower of compute (the weights' matmuls over every scheduled token, plus attention over
    the context each token sees) and memory (the weights once, plus every resident KV token the
    step attends over)."""
    compute_flops = (
        tokens * profile.flops_per_token + attention_ctx_tokens * profile.attention_flops_per_token_ctx
    )
    compute_s = compute_flops / (profile.peak_flops * profile.mfu_ratio)
    memory_bytes = profile.weights_bytes + kv_read_tokens * profile.kv_bytes_per_token
    memory_s = memory_bytes / (profile.hbm_bytes_per_s * profile.hbm_efficiency_ratio)
    return profile.t_fixed_s + seqs * profile.seq_overhead_s + max(compute_s, memory_s)
