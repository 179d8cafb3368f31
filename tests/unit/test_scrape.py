"""The vLLM ``/metrics`` parser: v1 and v0 names, several engines, and pages it must not trust."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvgate.gateway.replicas.scrape import parse_vllm_metrics, scraped_capacity_tokens
from kvgate.vocabulary.replica import ScrapedMetrics

LABELS = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'

V1_PAGE = f"""# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 1234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{LABELS}}} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{LABELS}}} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{LABELS}}} 0.25
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{{LABELS},le="0.001"}} 0.0
vllm:time_to_first_token_seconds_bucket{{{LABELS},le="+Inf"}} 7.0
vllm:time_to_first_token_seconds_count{{{LABELS}}} 7.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{{LABELS},block_size="16",cache_dtype="auto",num_gpu_blocks="28125"}} 1.0
"""


VLLM_0_11_CACHE_CONFIG = (
    'vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",'
    'cpu_kvcache_space_bytes="None",cpu_offload_gb="0.0",enable_prefix_caching="True",engine="0",'
    'gpu_memory_utilization="0.65",is_attention_free="False",kv_cache_memory_bytes="None",'
    'kv_sharing_fast_prefill="False",mamba_cache_dtype="auto",mamba_page_size_padded="None",'
    'mamba_ssm_cache_dtype="auto",num_cpu_blocks="None",num_gpu_blocks="9271",'
    'num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None",'
    'swap_space="0.0",swap_space_bytes="0.0"} 1.0'
)
"""A vLLM 0.11 replica's line, as quoted in vllm-project/vllm#28924: every ``CacheConfig`` field as a
label, ``engine`` among them, no ``model_name``, and ``None`` for fields never set."""


def engine_page(engine: int, running: int, waiting: int, usage: float, blocks: int | None) -> str:
    labels = f'engine="{engine}",model_name="m"'
    lines = [
        f"vllm:num_requests_running{{{labels}}} {running}.0",
        f"vllm:num_requests_waiting{{{labels}}} {waiting}.0",
        f"vllm:kv_cache_usage_perc{{{labels}}} {usage}",
    ]
    if blocks is not None:
        lines.append(f'vllm:cache_config_info{{block_size="16",{labels},num_gpu_blocks="{blocks}"}} 1.0')
    return "\n".join(lines) + "\n"


def test_v1_page_is_read_with_its_capacity() -> None:
    scraped = parse_vllm_metrics(V1_PAGE, now_s=12.5)
    assert scraped == ScrapedMetrics(
        kv_cache_usage_ratio=0.25,
        num_requests_running=3,
        num_requests_waiting=2,
        num_gpu_blocks=28125,
        block_size_tokens=16,
        scraped_at_s=12.5,
    )
    assert scraped_capacity_tokens(scraped) == 450_000


def test_engines_are_summed_and_usage_is_weighted_by_their_blocks() -> None:
    text = engine_page(0, running=3, waiting=1, usage=0.5, blocks=100) + engine_page(
        1, running=4, waiting=5, usage=0.0, blocks=300
    )
    scraped = parse_vllm_metrics(text, now_s=0.0)
    assert scraped is not None
    assert (scraped.num_requests_running, scraped.num_requests_waiting) == (7, 6)
    assert scraped.num_gpu_blocks == 400
    assert scraped.kv_cache_usage_ratio == pytest.approx(0.125)
    assert scraped_capacity_tokens(scraped) == 400 * 16


def test_without_cache_config_capacity_is_unknown_and_usage_is_the_plain_mean() -> None:
    text = engine_page(0, 1, 0, 0.2, None) + engine_page(1, 1, 0, 0.6, None)
    scraped = parse_vllm_metrics(text, now_s=0.0)
    assert scraped is not None
    assert scraped.kv_cache_usage_ratio == pytest.approx(0.4)
    assert (scraped.num_gpu_blocks, scraped.block_size_tokens) == (None, None)
    assert scraped_capacity_tokens(scraped) is None
    assert scraped_capacity_tokens(None) is None


def test_usage_is_the_plain_mean_when_one_engine_lacks_its_cache_config() -> None:
    text = engine_page(0, 1, 0, 0.2, 100) + engine_page(1, 1, 0, 0.6, None)
    scraped = parse_vllm_metrics(text, now_s=0.0)
    assert scraped is not None
    assert scraped.kv_cache_usage_ratio == pytest.approx(0.4)
    assert scraped.num_gpu_blocks == 100


def test_v0_usage_name_is_a_fallback_and_v1_wins_when_both_are_present() -> None:
    v0 = V1_PAGE.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    scraped = parse_vllm_metrics(v0, now_s=0.0)
    assert scraped is not None and scraped.kv_cache_usage_ratio == 0.25
    both = V1_PAGE + f"vllm:gpu_cache_usage_perc{{{LABELS}}} 0.9\n"
    scraped = parse_vllm_metrics(both, now_s=0.0)
    assert scraped is not None and scraped.kv_cache_usage_ratio == 0.25


@pytest.mark.parametrize(
    "missing", ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
)
def test_a_page_without_a_core_gauge_is_not_trusted(missing: str) -> None:
    text = "\n".join(line for line in V1_PAGE.splitlines() if not line.startswith(missing))
    assert parse_vllm_metrics(text, now_s=0.0) is None


@pytest.mark.parametrize("text", ["", "\n\n", "not a metrics page at all", "<html>502 Bad Gateway</html>"])
def test_pages_that_are_not_vllm_give_nothing(text: str) -> None:
    assert parse_vllm_metrics(text, now_s=0.0) is None


def test_unlabelled_samples_timestamps_and_a_first_line_without_help() -> None:
    text = (
        "vllm:num_requests_running 4 1700000000000\n"
        "vllm:num_requests_waiting\t1e1\n"
        "vllm:kv_cache_usage_perc 0.5"
    )
    scraped = parse_vllm_metrics(text, now_s=0.0)
    assert scraped is not None
    assert (scraped.num_requests_running, scraped.num_requests_waiting) == (4, 10)
    assert scraped.kv_cache_usage_ratio == 0.5


def test_garbage_and_look_alike_lines_are_skipped() -> None:
    garbage = "\n".join(
        [
            'vllm:num_requests_running{engine="1" 50',
            'vllm:num_requests_running{engine="2"} NaN',
            'vllm:num_requests_running{engine="3"} -4',
            'vllm:num_requests_running{engine="4"} many',
            'vllm:num_requests_running_by_reason{engine="0"} 60',
            "xvllm:num_requests_running 70",
            "# vllm:num_requests_running 80",
            'vllm:num_requests_running{engine="5"}',
            'vllm:num_requests_running{engine="6"}99',
            'vllm:cache_config_info{block_size="sixteen",engine="0",num_gpu_blocks="100"} 1.0',
            'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="-5"} 1.0',
        ]
    )
    scraped = parse_vllm_metrics(V1_PAGE.replace("block_size=", "block_size_x=") + garbage, now_s=0.0)
    assert scraped is not None
    assert scraped.num_requests_running == 3
    assert (scraped.num_gpu_blocks, scraped.block_size_tokens) == (None, None)


def test_label_values_may_hold_braces_commas_and_escaped_quotes() -> None:
    labels = 'engine="0",model_name="odd } name, with \\"quotes\\""'
    text = (
        f"vllm:num_requests_running{{{labels}}} 2\n"
        f"vllm:num_requests_waiting{{{labels}}} 1\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} 0.75\n"
        f'vllm:cache_config_info{{{labels},block_size="32",num_gpu_blocks="10"}} 1.0\n'
    )
    scraped = parse_vllm_metrics(text, now_s=0.0)
    assert scraped is not None
    assert (scraped.num_requests_running, scraped.kv_cache_usage_ratio) == (2, 0.75)
    assert scraped_capacity_tokens(scraped) == 320


@given(
    st.lists(
        st.one_of(
            st.text(max_size=40),
            st.sampled_from(
                [
                    "vllm:num_requests_running",
                    "vllm:num_requests_waiting",
                    "vllm:kv_cache_usage_perc",
                    "vllm:cache_config_info",
                    '{engine="0"',
                    "}",
                    " 1.5",
                    '",num_gpu_blocks="',
                    "\n",
                ]
            ),
        ),
        max_size=30,
    )
)
def test_any_text_parses_to_a_value_or_none_without_raising(parts: list[str]) -> None:
    scraped = parse_vllm_metrics("".join(parts), now_s=1.0)
    if scraped is not None:
        assert scraped.num_requests_running >= 0 and scraped.num_requests_waiting >= 0
        assert scraped.kv_cache_usage_ratio >= 0
        capacity = scraped_capacity_tokens(scraped)
        assert capacity is None or capacity > 0


def test_a_vllm_0_11_cache_config_line_gives_blocks_times_block_size() -> None:
    page = "\n".join(line for line in V1_PAGE.splitlines() if "cache_config_info{" not in line)
    scraped = parse_vllm_metrics(page + "\n" + VLLM_0_11_CACHE_CONFIG + "\n", now_s=0.0)
    assert scraped is not None
    assert (scraped.num_gpu_blocks, scraped.block_size_tokens) == (9271, 16)
    assert scraped_capacity_tokens(scraped) == 9271 * 16


HYBRID_CACHE_CONFIG = (
    'vllm:cache_config_info{block_size="4",cache_dtype="fp8_ds_mla",enable_prefix_caching="True",'
    'engine="0",gpu_memory_utilization="0.85",kv_cache_size_tokens="1179770",num_gpu_blocks="20377",'
    'sliding_window="128"} 1.0'
)
"""A hybrid-attention model's line on a vLLM with ``kv_cache_size_tokens`` (vllm-project/vllm#42206,
labels as quoted in #51163): its blocks differ in size per KV group, so ``num_gpu_blocks x block_size``
(81,508) is not its capacity; ``kv_cache_size_tokens`` is vLLM's own count."""


def test_kv_cache_size_tokens_is_the_capacity_when_vllm_reports_it() -> None:
    page = "\n".join(line for line in V1_PAGE.splitlines() if "cache_config_info{" not in line)
    scraped = parse_vllm_metrics(page + "\n" + HYBRID_CACHE_CONFIG + "\n", now_s=0.0)
    assert scraped_capacity_tokens(scraped) == 1_179_770
    unset = HYBRID_CACHE_CONFIG.replace('kv_cache_size_tokens="1179770"', 'kv_cache_size_tokens="None"')
    scraped = parse_vllm_metrics(page + "\n" + unset + "\n", now_s=0.0)
    assert scraped_capacity_tokens(scraped) == 20377 * 4, "not set: blocks x block size"


def test_each_engine_counts_its_own_kv_cache_size_tokens() -> None:
    text = engine_page(0, 1, 0, 0.5, 100) + engine_page(1, 1, 0, 0.5, 100)
    text = text.replace('num_gpu_blocks="100"', 'kv_cache_size_tokens="1500",num_gpu_blocks="100"', 1)
    scraped = parse_vllm_metrics(text, now_s=0.0)
    assert scraped_capacity_tokens(scraped) == 1500 + 100 * 16
