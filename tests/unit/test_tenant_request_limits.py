"""A tenant's requests per minute and requests at once, on the pure core with an injected clock;
model aliases as the config validates them."""

from __future__ import annotations

import pytest

from kvgate.admission import refusals
from kvgate.admission.decision import RefusalReason
from kvgate.admission.tenants import RequestLimit, TenantDirectory
from kvgate.config.admission import AdmissionConfig
from kvgate.config.auth import AuthConfig, TenantKeys
from kvgate.config.loader import parse_config
from kvgate.config.tenants import TenantConfig


def directory(**limits: int) -> TenantDirectory:
    keys = (TenantKeys(name="t", api_keys=("k",)),)
    return TenantDirectory(
        AdmissionConfig(tenants=(TenantConfig(name="t", **limits),)), AuthConfig(tenants=keys)
    )


def test_requests_per_minute_refill_continuously_and_say_how_long_to_wait() -> None:
    tenants = directory(requests_per_min=60)
    tenant = tenants.identify("k")
    assert tenant is not None
    for _ in range(60):
        assert tenants.open_request(tenant, 0.0) is None
        tenants.close_request(tenant)
    limit = tenants.open_request(tenant, 0.0)
    assert limit == RequestLimit(False, pytest.approx(1.0))
    assert tenants.open_request(tenant, 0.5) is not None, "half a request refilled is not one"
    assert tenants.open_request(tenant, 1.0) is None
    assert tenants.in_flight == {"t": 1}


def test_concurrent_requests_are_held_to_the_limit_and_given_back_when_they_end() -> None:
    tenants = directory(max_concurrent_requests=2)
    tenant = tenants.identify("k")
    assert tenant is not None
    assert tenants.open_request(tenant, 0.0) is None
    assert tenants.open_request(tenant, 0.0) is None
    limit = tenants.open_request(tenant, 0.0)
    assert limit is not None and limit.concurrent
    tenants.close_request(tenant)
    assert tenants.open_request(tenant, 0.0) is None
    tenants.close_request(tenant)
    tenants.close_request(tenant)
    assert tenants.in_flight == {}, "back to zero once every request ended"


def test_a_refused_request_is_not_counted_in_flight() -> None:
    tenants = directory(requests_per_min=1, max_concurrent_requests=5)
    tenant = tenants.identify("k")
    assert tenant is not None
    assert tenants.open_request(tenant, 0.0) is None
    assert tenants.open_request(tenant, 0.0) is not None
    assert tenants.in_flight == {"t": 1}


def test_n_gateways_each_hold_their_share_of_both_limits() -> None:
    tenants = directory(requests_per_min=60, max_concurrent_requests=3)
    tenant = tenants.identify("k")
    assert tenant is not None
    tenants.share(2, 0.0)
    assert tenants.open_request(tenant, 0.0) is None
    assert tenants.open_request(tenant, 0.0) is None
    limit = tenants.open_request(tenant, 0.0)
    assert limit is not None and limit.concurrent, "half of 3 at once, rounded up, is 2"
    for _ in range(2):
        tenants.close_request(tenant)
    opened = 0
    while tenants.open_request(tenant, 0.0) is None:
        tenants.close_request(tenant)
        opened += 1
    assert opened == 28, "30 a minute here (2 taken above), the other 30 the other gateway's"


def test_a_tenant_without_request_limits_is_never_counted() -> None:
    tenants = TenantDirectory(AdmissionConfig(), AuthConfig())
    assert tenants.open_request(tenants.anonymous, 0.0) is None
    assert tenants.in_flight == {}


def test_each_limit_refuses_with_its_own_reason_and_a_retry_hint() -> None:
    tenants = directory(requests_per_min=10, max_concurrent_requests=1)
    tenant = tenants.identify("k")
    assert tenant is not None
    config = AdmissionConfig()
    at_once = refusals.over_request_limit(tenant, RequestLimit(True, 1.0), config)
    per_min = refusals.over_request_limit(tenant, RequestLimit(False, 6.0), config)
    assert (at_once.status, at_once.reason) == (429, RefusalReason.TENANT_CONCURRENCY)
    assert (per_min.status, per_min.reason) == (429, RefusalReason.TENANT_REQUESTS)
    assert per_min.retry_after is not None and per_min.retry_after.seconds == 6
    assert "10 requests per minute" in per_min.message


def model_config(*models: dict[str, object]) -> dict[str, object]:
    return {"models": list(models), "pools": [{"name": "p", "replicas": ["http://10.0.0.1:8000"]}]}


def test_aliases_must_name_one_model_only() -> None:
    base = {"max_model_len": 4096, "kv_bytes_per_token": 1}
    ok = parse_config(model_config({"name": "m", "aliases": ["public"], **base}), {})
    assert ok.models[0].aliases == ("public",)
    for clash in (
        [{"name": "m", "aliases": ["x"], **base}, {"name": "n", "aliases": ["x"], **base}],
        [{"name": "m", "aliases": ["n"], **base}, {"name": "n", **base}],
    ):
        with pytest.raises(ValueError, match="aliases"):
            parse_config(model_config(*clash), {})
