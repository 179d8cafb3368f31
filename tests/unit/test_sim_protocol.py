"""The simulator's wire format: vLLM's validation answers, error shape and /metrics page."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kvgate.sim.engine import Engine
from kvgate.sim.metrics import render_metrics
from kvgate.sim.profile import resolve_profile
from kvgate.sim.protocol import ApiError, GenerationRequest, StreamTemplates, length_error, parse_generation

MODEL = "m"


def _parse(body: object, chat: bool = True) -> GenerationRequest | ApiError:
    return parse_generation(orjson.dumps(body), chat, MODEL)


@pytest.mark.parametrize(
    ("body", "chat", "status", "fragment"),
    [
        ([1, 2], True, 400, "JSON object"),
        ({"model": MODEL}, True, 400, "messages"),
        ({"model": MODEL, "messages": []}, True, 400, "at least one"),
        ({"model": MODEL}, False, 400, "prompt"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 0}, False, 400, "at least 1"),
        ({"model": MODEL, "prompt": "x", "max_tokens": "9"}, False, 400, "integer"),
        ({"model": MODEL, "prompt": "x", "n": 0}, False, 400, "n must be"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 5, "min_tokens": 6}, False, 400, "min_tokens"),
        (
            {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}},
            False,
            400,
            "stream=True",
        ),
        ({"model": "other", "prompt": "x"}, False, 404, "The model `other` does not exist."),
    ],
)
def test_bad_requests_get_vllm_errors(body: object, chat: bool, status: int, fragment: str) -> None:
    error = _parse(body, chat)
    assert isinstance(error, ApiError)
    assert error.status == status
    payload = orjson.loads(error.body())["error"]
    assert set(payload) == {"message", "type", "param", "code"}
    assert fragment in payload["message"]
    assert payload["code"] == status
    assert payload["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


def test_malformed_json_is_a_400() -> None:
    error = parse_generation(b"{not json", True, MODEL)
    assert isinstance(error, ApiError) and error.status == 400


def test_completions_default_to_16_tokens_and_chat_to_the_context_left() -> None:
    completion = _parse({"model": MODEL, "prompt": ["a", "b"]}, chat=False)
    chat = _parse({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert isinstance(completion, GenerationRequest) and completion.max_tokens == 16
    assert completion.prompts == ["a", "b"]
    assert isinstance(chat, GenerationRequest) and chat.max_tokens is None


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [
        ("a", ["a"]),
        (["a", "b", "c"], ["a", "b", "c"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
)
def test_completions_prompts_are_each_their_own_request_as_in_vllm(prompt: object, prompts: object) -> None:
    parsed = _parse({"model": MODEL, "prompt": prompt}, chat=False)
    assert isinstance(parsed, GenerationRequest) and parsed.prompts == prompts


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": []}, "prompt"),
        ({"prompt": [[]]}, "prompt"),
        ({"prompt": ["a", 1]}, "prompt"),
        ({"prompt": "x", "best_of": 2}, "best_of"),
    ],
)
def test_prompts_and_best_of_vllm_refuses(body: dict[str, object], param: str) -> None:
    error = _parse({"model": MODEL, **body}, chat=False)
    assert isinstance(error, ApiError) and error.status == 400 and error.param == param


def test_completions_read_max_tokens_only() -> None:
    parsed = _parse({"model": MODEL, "prompt": "x", "max_tokens": 30, "max_completion_tokens": 1}, chat=False)
    assert isinstance(parsed, GenerationRequest) and parsed.max_tokens == 30


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    parsed = _parse(
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 9, "max_completion_tokens": 3}
    )
    assert isinstance(parsed, GenerationRequest) and parsed.max_tokens == 3 and parsed.model == MODEL


def test_length_errors_follow_vllm_wording() -> None:
    too_long = length_error(100, 90, 20)
    assert too_long is not None and too_long.status == 400
    assert (
        "maximum context length is 100 tokens" in too_long.message and "(20 > 100 - 90)" in too_long.message
    )
    prompt_only = length_error(100, 100, None)
    assert prompt_only is not None and "100 input tokens" in prompt_only.message
    assert length_error(100, 50, 50) is None


def test_stream_templates_make_valid_chunks() -> None:
    templates = StreamTemplates(True, "chatcmpl-1", 7, MODEL, 2)
    role = orjson.loads(templates.role_chunks[1].removeprefix(b"data: "))
    assert role["choices"][0] == {
        "index": 1,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    last = orjson.loads(
        (templates.heads[0] + b" hi" + templates.tail_stop % b"length").removeprefix(b"data: ")
    )
    assert last["object"] == "chat.completion.chunk"
    assert (
        last["choices"][0]["delta"] == {"content": " hi"} and last["choices"][0]["finish_reason"] == "length"
    )
    usage = orjson.loads(templates.usage_chunk(5, 3).removeprefix(b"data: "))
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 5,
        "total_tokens": 8,
        "completion_tokens": 3,
    }
    text = StreamTemplates(False, "cmpl-1", 7, MODEL, 1)
    chunk = orjson.loads((text.heads[0] + b" x" + text.tail).removeprefix(b"data: "))
    assert chunk["object"] == "text_completion" and chunk["choices"][0]["text"] == " x"


EXPECTED = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:cache_config_info": "gauge",
    "kvgate_sim_lag_ratio": "gauge",
}


VLLM_CACHE_CONFIG_LABELS = {
    "block_size",
    "cache_dtype",
    "calculate_kv_scales",
    "cpu_kvcache_space_bytes",
    "cpu_offload_gb",
    "enable_prefix_caching",
    "engine",
    "gpu_memory_utilization",
    "is_attention_free",
    "kv_cache_memory_bytes",
    "kv_offloading_backend",
    "kv_offloading_size",
    "kv_sharing_fast_prefill",
    "mamba_cache_dtype",
    "mamba_page_size_padded",
    "mamba_ssm_cache_dtype",
    "num_cpu_blocks",
    "num_gpu_blocks",
    "num_gpu_blocks_override",
    "prefix_caching_hash_algo",
    "sliding_window",
    "swap_space",
    "swap_space_bytes",
}
"""The labels of ``vllm:cache_config_info`` on a vLLM 0.11 replica (every ``CacheConfig`` field, plus
``engine``, and no ``model_name``), as quoted in vllm-project/vllm#28924, with the two of vLLM 0.32 that
describe KV offloading to host memory."""


def test_metrics_page_parses_with_every_vllm_name_and_label() -> None:
    engine = Engine(resolve_profile(overrides={"kv_capacity_tokens": 1600}))
    engine.add_request("a", list(range(40)), 3, 0.0, ignore_eos=True)
    now_s = 0.0
    while engine.has_work:
        now_s = engine.step(now_s).end_s
    families = {
        f.name: f for f in text_string_to_metric_families(render_metrics(engine, MODEL, 0.0).decode())
    }
    for name, kind in EXPECTED.items():
        assert families[name].type == kind, name
        for sample in families[name].samples:
            assert sample.labels["engine"] == "0", sample
            if name != "vllm:cache_config_info":
                assert sample.labels["model_name"] == MODEL, sample
    success = {s.labels["finished_reason"]: s.value for s in families["vllm:request_success"].samples}
    assert success == {"stop": 0.0, "length": 1.0, "abort": 0.0}
    info = families["vllm:cache_config_info"].samples[0].labels
    assert (info["block_size"], info["num_gpu_blocks"]) == ("16", "100")
    assert set(info) == VLLM_CACHE_CONFIG_LABELS, "the label set of vLLM's own info gauge"
    ttft = {
        s.name: s.value for s in families["vllm:time_to_first_token_seconds"].samples if "le" not in s.labels
    }
    assert ttft["vllm:time_to_first_token_seconds_count"] == 1.0
    itl = families["vllm:inter_token_latency_seconds"]
    assert [s.value for s in itl.samples if s.labels.get("le") == "+Inf"] == [2.0]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_FIELDS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "n", "min_tokens", "stream"]


@settings(max_examples=120, deadline=None)
@given(st.dictionaries(st.sampled_from([*_FIELDS, "stream_options", "ignore_eos"]), _JSON), st.booleans())
def test_any_json_body_gets_an_answer_not_an_exception(body: dict[str, object], chat: bool) -> None:
    parsed = parse_generation(json.dumps(body).encode(), chat, MODEL)
    if isinstance(parsed, ApiError):
        assert parsed.status in (400, 404)
    else:
        assert parsed.n >= 1 and (parsed.max_tokens is None or parsed.max_tokens >= 1)
