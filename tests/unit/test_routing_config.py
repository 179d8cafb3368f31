from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvgate.config.routing import SCORER_NAMES, RoutingConfig
from kvgate.routing.scorers import SCORERS


def test_defaults_are_valid_and_frozen() -> None:
    config = RoutingConfig()
    assert config.policy == "kvgate"
    assert set(config.scorer_weights) == set(SCORER_NAMES)
    with pytest.raises(ValidationError):
        config.policy = "round_robin"


def test_scorer_registry_matches_the_names_config_accepts() -> None:
    assert set(SCORERS) == set(SCORER_NAMES)


def test_unknown_scorer_fails_listing_known_names() -> None:
    with pytest.raises(ValidationError) as raised:
        RoutingConfig(scorer_weights={"outstanding_tokens": 1.0, "queue_depth": 2.0})
    message = str(raised.value)
    assert "queue_depth" in message
    for name in SCORER_NAMES:
        assert name in message


def test_unknown_policy_and_unknown_key_fail() -> None:
    with pytest.raises(ValidationError, match="round_robin"):
        RoutingConfig(policy="random")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="warmup_seconds"):
        RoutingConfig.model_validate({"warmup_seconds": 30})


@pytest.mark.parametrize(
    "fields",
    [
        {"scorer_weights": {"prefix_locality": -1.0}},
        {"bounded_load_factor": 1.0},
        {"min_ratio": 0.0},
        {"aggression": 0.0},
        {"ejection_backoff_base_s": 10.0, "ejection_backoff_max_s": 5.0},
        {"prefix_index_capacity_blocks": 0},
        {"scorer_weights": {"outstanding_tokens": 0.0}},
    ],
)
def test_bad_values_fail(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RoutingConfig.model_validate(fields)


def test_every_field_documents_default_and_example() -> None:
    for name, field in RoutingConfig.model_fields.items():
        description = field.description or ""
        assert "Default" in description and "Example" in description, name
