"""The auth section alone: one tenant per key, and auth on only with a key to accept."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kvgate.config.auth import AdminAccess, AuthConfig, TenantKeys


def test_defaults_ask_for_nothing() -> None:
    auth = AuthConfig()
    assert (auth.enabled, auth.tenants, auth.admin_token, auth.protect_observability) == (
        False,
        (),
        None,
        None,
    )
    assert auth.forward_client_credentials is False


def test_cross_field_problems_are_collected_at_once() -> None:
    with pytest.raises(ValidationError) as caught:
        AuthConfig(tenants=(TenantKeys(name="a", api_keys=("k1",)), TenantKeys(name="a", api_keys=("k1",))))
    text = str(caught.value)
    assert "name 'a' appears twice" in text and "already belongs to 'a'" in text


def test_auth_without_a_key_is_refused() -> None:
    with pytest.raises(ValidationError, match="every request would be 401"):
        AuthConfig(enabled=True)
    with pytest.raises(ValidationError, match="every request would be 401"):
        AuthConfig(enabled=True, tenants=(TenantKeys(name="keyless"),))


def test_tokens_given_as_digits_are_text() -> None:
    auth = AuthConfig.model_validate({"admin_token": 1234, "observability_token": 5678})
    assert auth.admin_token is not None and auth.admin_token.get_secret_value() == "1234"
    assert auth.observability_token is not None and auth.observability_token.get_secret_value() == "5678"
    keys = TenantKeys.model_validate({"name": "t", "api_keys": [42]})
    assert [k.get_secret_value() for k in keys.api_keys] == ["42"]


def test_admin_access_is_the_admin_token_alone() -> None:
    """What ``kvgate autoscale`` reads: the observability token is not its business."""
    assert set(AdminAccess.model_fields) == {"admin_token", "admin_token_file"}
    with pytest.raises(ValidationError, match="observability_token"):
        AdminAccess.model_validate({"observability_token": "x"})
