from __future__ import annotations

import pytest

from kvgate.admission.cost import (
    CostEstimate,
    InvalidRequest,
    estimate_cost,
    kv_bytes_per_token,
    requested_max_tokens,
)
from kvgate.config.admission import AdmissionConfig, MaxTokensPolicy, ModelAdmissionConfig
from kvgate.config.models import Architecture, Model

STRICT = ModelAdmissionConfig(max_tokens_policy=MaxTokensPolicy.REJECT)
CAPPED = ModelAdmissionConfig(default_max_tokens=512)
FACTS = Model(name="m", max_model_len=8192, kv_bytes_per_token=131072)
CONFIG = AdmissionConfig(
    models={"strict": STRICT, "capped": CAPPED}, default_model=CAPPED, max_output_tokens_ceiling=4096
)


def test_llama_31_8b_bf16_kv_bytes_per_token() -> None:
    assert kv_bytes_per_token(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2) == 131072


def test_cost_properties() -> None:
    cost = CostEstimate("m", prompt_tokens=100, max_output_tokens=28, kv_bytes_per_token=1000)
    assert (cost.kv_tokens, cost.kv_bytes) == (128, 128_000)


@pytest.mark.parametrize(
    ("model", "prompt", "max_tokens", "expected_cap"),
    [
        ("capped", 100, None, 512),  # default cap applied
        ("capped", 8000, None, 192),  # default cap shrunk to the context window
        ("capped", 100, 4096, 4096),  # at the ceiling
        ("strict", 100, 7, 7),
        ("strict", 4096, 4096, 4096),  # exactly the window
        ("unknown-model", 100, None, 512),  # default_model rules
    ],
)
def test_accepted_caps(model: str, prompt: int, max_tokens: int | None, expected_cap: int) -> None:
    cost = estimate_cost(model, prompt, max_tokens, CONFIG, FACTS)
    assert isinstance(cost, CostEstimate)
    assert (cost.prompt_tokens, cost.max_output_tokens) == (prompt, expected_cap)
    assert cost.kv_bytes_per_token == 131072


@pytest.mark.parametrize(
    ("model", "prompt", "max_tokens", "param", "fragment"),
    [
        ("strict", 100, None, "max_tokens", "is required for model 'strict'"),
        ("capped", 100, 4097, "max_tokens", "is too large: 4097"),
        ("strict", 4097, 4096, "max_tokens", "(4096 > 8192 - 4097)"),
        ("capped", 8192, None, "messages", "your request has at least 8192 input tokens"),
        ("strict", 9000, 10, "messages", "maximum context length is 8192 tokens"),
    ],
)
def test_rejected_requests(
    model: str, prompt: int, max_tokens: int | None, param: str, fragment: str
) -> None:
    invalid = estimate_cost(model, prompt, max_tokens, CONFIG, FACTS)
    assert isinstance(invalid, InvalidRequest)
    assert invalid.status == 400
    assert invalid.param == param
    assert fragment in invalid.message


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, None),
        ({"max_tokens": 10}, 10),
        ({"max_completion_tokens": 20, "max_tokens": 10}, 20),
        ({"max_completion_tokens": None, "max_tokens": 10}, 10),
    ],
)
def test_requested_max_tokens(body: dict[str, object], expected: int | None) -> None:
    assert requested_max_tokens(body) == expected


@pytest.mark.parametrize("value", [0, -1, 1.5, "10", True])
def test_requested_max_tokens_rejects_non_positive_integers(value: object) -> None:
    invalid = requested_max_tokens({"max_tokens": value})
    assert isinstance(invalid, InvalidRequest)
    assert invalid.param == "max_tokens"


def test_window_and_kv_bytes_are_the_model_facts_passed_in() -> None:
    facts = Model(
        name="m", max_model_len=1000, architecture=Architecture(layers=80, kv_heads=8, head_dim=128)
    )
    cost = estimate_cost("capped", 100, 900, CONFIG, facts)
    assert isinstance(cost, CostEstimate)
    assert cost.kv_bytes_per_token == kv_bytes_per_token(80, 8, 128, 2)
    assert isinstance(estimate_cost("capped", 100, 901, CONFIG, facts), InvalidRequest)
