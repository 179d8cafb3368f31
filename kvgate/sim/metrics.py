"""Renders one simulated engine as vLLM v1's ``/metrics`` page (Prometheus text format).

Names, types and the ``model_name``/``engine`` labels follow vLLM v1's Prometheus logger, so the
gateway's scraper and dashboards cannot tell the simulator from vLLM; ``vllm:cache_config_info``
carries the label set of vLLM 0.32 (every ``CacheConfig`` field and ``engine``, no ``model_name``),
``kv_cache_size_tokens`` included, which is where the gateway reads a replica's KV capacity, with
``kv_offloading_backend`` and ``kv_offloading_size`` (GiB) describing the host tier, if any.
The simulator's own health (how far its step loop ran behind schedule) and its role in disaggregated
prefill/decode serving are exported next to them as ``kvgate_sim_*``.
Rendered on demand by string building: a scrape costs nothing between scrapes.
"""

from __future__ import annotations

from kvgate.sim.engine import Engine
from kvgate.sim.profile import Profile
from kvgate.sim.stats import Histogram

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
"""Every ``finished_reason`` vLLM exports, each from the start (the simulator never sees the last two)."""


def _fmt(value: float) -> str:
    return repr(float(value))


def offloading_gib(profile: Profile) -> float:
    """The host tier as vLLM's ``--kv-offloading-size`` states it: GiB of KV."""
    return profile.cpu_offload_tokens * profile.kv_bytes_per_token / 2**30


def _cache_config_info(engine: Engine, engine_index: int) -> str:
    """vLLM's info gauge of its ``CacheConfig``: every field a label (values as ``str()`` gives them,
    ``None`` included), plus ``engine``, and unlike the other gauges no ``model_name``."""
    profile = engine.profile
    offloading = profile.num_cpu_blocks > 0
    capacity_tokens = profile.num_gpu_blocks * profile.block_size_tokens
    fields = {
        "_block_size_resolved": "True",
        "block_size": str(profile.block_size_tokens),
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(profile.block_size_tokens),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": "True",
        "engine": str(engine_index),
        "gpu_memory_utilization": "0.9",
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(round(capacity_tokens / profile.max_model_len, 2)),
        "kv_cache_memory_bytes": str(capacity_tokens * profile.kv_bytes_per_token),
        "kv_cache_size_tokens": str(capacity_tokens),
        "kv_offloading_backend": "native",
        "kv_offloading_size": str(offloading_gib(profile)) if offloading else "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": str(profile.num_cpu_blocks) if offloading else "None",
        "num_gpu_blocks": str(profile.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }
    return "vllm:cache_config_info{" + ",".join(f'{k}="{v}"' for k, v in fields.items()) + "} 1.0"


def render_metrics(
    engine: Engine, model: str, lag_s: float, role: str = "mixed", engine_index: int = 0
) -> bytes:
    labels = f'engine="{engine_index}",model_name="{model}"'
    stats = engine.stats
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")

    def gauge(name: str, value: float, help_text: str) -> None:
        family(name, "gauge", help_text)
        lines.append(f"{name}{{{labels}}} {_fmt(value)}")

    def counter(name: str, value: float, help_text: str) -> None:
        family(f"{name}_total", "counter", help_text)
        lines.append(f"{name}_total{{{labels}}} {_fmt(value)}")

    def by_source(name: str, counts: dict[str, int], help_text: str) -> None:
        family(f"{name}_total", "counter", help_text)
        for source, count in counts.items():
            lines.append(f'{name}_total{{{labels},source="{source}"}} {_fmt(count)}')

    def histogram(name: str, hist: Histogram, help_text: str) -> None:
        family(name, "histogram", help_text)
        # vLLM's bucket lines sort ``le`` among the labels: engine, le, model_name.
        before_le = f'{name}_bucket{{engine="{engine_index}",le="'
        after_le = f'",model_name="{model}"}} '
        for bound, cumulative in zip((*hist.bounds, float("inf")), hist.cumulative(), strict=True):
            le = "+Inf" if bound == float("inf") else _fmt(bound)
            lines.append(f"{before_le}{le}{after_le}{_fmt(cumulative)}")
        lines.append(f"{name}_count{{{labels}}} {_fmt(hist.count)}")
        lines.append(f"{name}_sum{{{labels}}} {_fmt(hist.sum)}")

    gauge("vllm:num_requests_running", engine.num_running, "Number of requests in model execution batches.")
    gauge("vllm:num_requests_waiting", engine.num_waiting, "Number of requests waiting to be processed.")
    gauge(
        "vllm:kv_cache_usage_perc", engine.kv_cache_usage_ratio, "KV-cache usage. 1 means 100 percent usage."
    )
    counter("vllm:num_preemptions", stats.num_preemptions, "Cumulative number of preemption from the engine.")
    counter(
        "vllm:prefix_cache_queries",
        stats.prefix_cache_queries_tokens,
        "Prefix cache queries, in terms of number of queried tokens.",
    )
    counter(
        "vllm:prefix_cache_hits",
        stats.prefix_cache_hits_tokens,
        "Prefix cache hits, in terms of number of cached tokens.",
    )
    counter(
        "kvgate_sim_first_schedule_prefix_queries",
        stats.first_schedule_queries_tokens,
        "Prefix cache queries in tokens, each request's first schedule only (not again after preemption).",
    )
    counter(
        "kvgate_sim_first_schedule_prefix_hits",
        stats.first_schedule_hits_tokens,
        "Prefix cache hits in tokens, each request's first schedule only (not again after preemption).",
    )
    counter(
        "vllm:external_prefix_cache_queries",
        stats.external_prefix_cache_queries_tokens,
        "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number "
        "of queried tokens.",
    )
    counter(
        "vllm:external_prefix_cache_hits",
        stats.external_prefix_cache_hits_tokens,
        "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of "
        "cached tokens.",
    )
    counter("vllm:prompt_tokens", stats.prompt_tokens, "Number of prefill tokens processed.")
    by_source(
        "vllm:prompt_tokens_by_source", stats.prompt_tokens_by_source, "Number of prompt tokens by source."
    )
    counter(
        "vllm:prompt_tokens_cached",
        sum(stats.cached_tokens_by_source.values()),
        "Number of cached prompt tokens (local + external).",
    )
    by_source(
        "vllm:prompt_tokens_cached_by_source",
        stats.cached_tokens_by_source,
        "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded "
        "to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
        "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
    )
    counter("vllm:generation_tokens", stats.generation_tokens, "Number of generation tokens processed.")
    family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
    for reason in FINISHED_REASONS:
        count = stats.request_success.get(reason, 0)
        lines.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {_fmt(count)}')
    histogram(
        "vllm:time_to_first_token_seconds", stats.ttft_s, "Histogram of time to first token in seconds."
    )
    histogram("vllm:inter_token_latency_seconds", stats.itl_s, "Histogram of inter-token latency in seconds.")
    histogram("vllm:e2e_request_latency_seconds", stats.e2e_s, "Histogram of e2e request latency in seconds.")
    histogram(
        "vllm:request_queue_time_seconds",
        stats.queue_s,
        "Histogram of time spent in WAITING phase for request.",
    )
    family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig")
    lines.append(_cache_config_info(engine, engine_index))
    family("kvgate_sim_role_info", "gauge", "The replica's role in disaggregated serving (label role).")
    lines.append(f'kvgate_sim_role_info{{{labels},role="{role}"}} 1.0')
    counter("kvgate_sim_lag_seconds", lag_s, "Simulated seconds the step loop started steps behind schedule.")
    counter("kvgate_sim_busy_seconds", stats.busy_s, "Simulated seconds the engine spent running steps.")
    gauge(
        "kvgate_sim_lag_ratio",
        lag_s / stats.busy_s if stats.busy_s > 0 else 0.0,
        "Lag behind schedule per busy second; a run above 0.05 is not faithful.",
    )
    lines.append("")
    return "\n".join(lines).encode()
