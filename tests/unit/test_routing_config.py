from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvgate.config.loader import parse_config
from kvgate.config.routing import RoutingConfig
from tests.unit.test_config import MINIMAL


def test_defaults_are_valid_and_frozen() -> None:
    config = RoutingConfig()
    assert (config.policy, config.block_size_tokens, config.ttft_tolerance_s) == ("kvgate", 16, 0.5)
    with pytest.raises(ValidationError):
        config.policy = "round_robin"


def test_unknown_policy_and_unknown_key_fail() -> None:
    with pytest.raises(ValidationError, match="round_robin"):
        RoutingConfig(policy="random")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="warmup_seconds"):
        RoutingConfig.model_validate({"warmup_seconds": 30})


@pytest.mark.parametrize(
    "fields",
    [
        {"block_size_tokens": 0},
        {"ttft_tolerance_s": -1.0},
        {"affinity_min_tokens": -1},
        {"host_tier_bytes_per_s": 0},
        {"min_ratio": 0.0},
        {"aggression": 0.0},
        {"ejection_backoff_base_s": 10.0, "ejection_backoff_max_s": 5.0},
        {"prefix_index_capacity_blocks": 0},
    ],
)
def test_bad_values_fail(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RoutingConfig.model_validate(fields)


def test_every_field_documents_default_and_example() -> None:
    for name, field in RoutingConfig.model_fields.items():
        description = field.description or ""
        assert "Default" in description and "Example" in description, name


def test_the_retired_scoring_keys_still_load_with_a_warning_each() -> None:
    warnings: list[str] = []
    retired = {"scorer_weights": {"prefix_locality": 2}, "bounded_load_factor": 1.5, "scan_prompt_tokens": 0}
    document = {**MINIMAL, "routing": {**retired, "ttft_tolerance_s": 1}}
    config = parse_config(document, {}, warn=warnings.append)
    assert config.routing.ttft_tolerance_s == 1
    assert sorted(w.split(" ")[0] for w in warnings) == [
        "routing.bounded_load_factor",
        "routing.scan_prompt_tokens",
        "routing.scorer_weights",
    ]
    assert all("no longer used" in w and "remove it" in w for w in warnings)
