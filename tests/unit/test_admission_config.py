from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from kvgate.config import admission, tenants
from kvgate.config.admission import AdmissionConfig, ModelAdmissionConfig
from kvgate.config.tenants import TenantConfig


def test_defaults_are_valid_and_frozen() -> None:
    config = AdmissionConfig()
    assert config.model_rules("anything") == config.default_model
    with pytest.raises(ValidationError):
        config.max_queue_wait_s = 1.0


def test_unknown_keys_fail() -> None:
    with pytest.raises(ValidationError, match="max_queue_wait"):
        AdmissionConfig.model_validate({"max_queue_wait": 3})


def test_field_errors_are_collected_at_once() -> None:
    with pytest.raises(ValidationError) as caught:
        AdmissionConfig.model_validate(
            {"max_queue_wait_s": -1, "queue_max_requests": -2, "retry_after_cap_s": 500}
        )
    fields = {error["loc"][0] for error in caught.value.errors()}
    assert fields == {"max_queue_wait_s", "queue_max_requests", "retry_after_cap_s"}


def test_cross_field_problems_are_collected_at_once() -> None:
    with pytest.raises(ValidationError) as caught:
        AdmissionConfig(
            max_output_tokens_ceiling=100,
            default_model=ModelAdmissionConfig(default_max_tokens=200),
            tenants=(TenantConfig(name="a"), TenantConfig(name="a")),
        )
    text = str(caught.value)
    assert "name 'a' appears twice" in text
    assert "default_model.default_max_tokens = 200 tokens exceeds" in text


@pytest.mark.parametrize("moved", ["auth_enabled", "api_keys"])
def test_the_auth_keys_are_not_admission_keys(moved: str) -> None:
    """They are the auth section's (``kvgate.config.auth``); the loader moves them from here."""
    with pytest.raises(ValidationError, match=moved):
        AdmissionConfig.model_validate(
            {moved: True} if moved == "auth_enabled" else {"tenants": [{"name": "a", moved: ["k"]}]}
        )


@pytest.mark.parametrize("fact", ["max_model_len_tokens", "kv_bytes_per_token", "tokenizer", "chat_template"])
def test_model_facts_are_not_admission_keys(fact: str) -> None:
    with pytest.raises(ValidationError, match=fact):
        ModelAdmissionConfig.model_validate({fact: 1})


def _models() -> list[type[BaseModel]]:
    return [
        value
        for module in (admission, tenants)
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, BaseModel)
        and value.__module__ == module.__name__
        and not value.__name__.startswith("_")
    ]


@pytest.mark.parametrize("model", _models(), ids=lambda m: m.__name__)
def test_every_field_documents_unit_default_and_example(model: type[BaseModel]) -> None:
    for name, field in model.model_fields.items():
        description = field.description or ""
        assert "Example" in description, f"{model.__name__}.{name}"
        assert "Default" in description or "default" in description, f"{model.__name__}.{name}"
        assert "(" in description, f"{model.__name__}.{name} states no unit"
