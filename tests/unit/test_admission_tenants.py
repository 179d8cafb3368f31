from __future__ import annotations

import pytest

from kvgate.admission.deadline import client_timeout_s
from kvgate.admission.tenants import Tenant, TenantDirectory, TokenBucket
from kvgate.config.admission import AdmissionConfig, DeadlineHeader
from kvgate.config.auth import AuthConfig, TenantKeys
from kvgate.config.tenants import PriorityClass, TenantConfig

TENANTS = (
    TenantConfig(name="search", weight=2.0, priority=PriorityClass.CRITICAL),
    TenantConfig(name="batch", tokens_per_min=6000),
)
KEYS = (TenantKeys(name="search", api_keys=("sk-s1", "sk-s2")), TenantKeys(name="batch", api_keys=("sk-b",)))


def directory_of(metered: TenantConfig | None = None, enabled: bool = False) -> TenantDirectory:
    """``TENANTS`` with ``KEYS``; or ``metered`` alone, with the key ``k``."""
    if metered is None:
        return TenantDirectory(AdmissionConfig(tenants=TENANTS), AuthConfig(enabled=enabled, tenants=KEYS))
    keys = (TenantKeys(name=metered.name, api_keys=("k",)),)
    return TenantDirectory(AdmissionConfig(tenants=(metered,)), AuthConfig(enabled=enabled, tenants=keys))


@pytest.mark.parametrize(
    ("auth", "key", "expected"),
    [
        (True, "sk-s2", "search"),
        (True, "sk-unknown", None),
        (True, None, None),
        (False, "sk-b", "batch"),
        (False, "sk-unknown", "anonymous"),
        (False, None, "anonymous"),
    ],
)
def test_identify(auth: bool, key: str | None, expected: str | None) -> None:
    directory = directory_of(enabled=auth)
    tenant = directory.identify(key)
    assert (tenant.name if tenant else None) == expected


def test_tenant_values_come_from_config() -> None:
    directory = directory_of()
    assert directory.identify("sk-s1") == Tenant("search", 2.0, PriorityClass.CRITICAL, None)
    assert {t.name for t in directory.tenants()} == {"anonymous", "search", "batch"}


def test_a_tenant_with_keys_and_no_admission_entry_gets_the_defaults() -> None:
    keys = AuthConfig(tenants=(TenantKeys(name="new", api_keys=("sk-n",)),))
    assert TenantDirectory(AdmissionConfig(), keys).identify("sk-n") == Tenant("new")


def test_bucket_refills_continuously_up_to_one_minute() -> None:
    bucket = TokenBucket(tokens_per_min=600, now_s=0.0)
    assert bucket.take(600, 0.0) == 0.0
    assert bucket.take(100, 0.0) == pytest.approx(10.0)
    assert bucket.level_tokens == 0.0  # a refused take changes nothing
    assert bucket.take(100, 10.0) == 0.0
    assert bucket.wait_s(600, 1000.0) == 0.0
    assert bucket.level_tokens == 600.0


def test_oversized_request_passes_only_from_a_full_bucket_then_owes() -> None:
    bucket = TokenBucket(tokens_per_min=600, now_s=0.0)
    assert bucket.take(1, 0.0) == 0.0
    assert bucket.take(6000, 0.0) == pytest.approx(0.1)
    assert bucket.take(6000, 0.1) == 0.0
    assert bucket.level_tokens == pytest.approx(-5400.0)
    assert bucket.wait_s(10, 0.1) == pytest.approx(541.0)


def test_unlimited_tenants_are_never_charged() -> None:
    directory = directory_of()
    search = directory.identify("sk-s1")
    assert search is not None
    assert all(directory.take(search, 10**9, 0.0) == 0.0 for _ in range(3))


def test_refund_is_capped_at_the_bucket() -> None:
    directory = directory_of()
    batch = directory.identify("sk-b")
    assert batch is not None
    assert directory.take(batch, 6000, 0.0) == 0.0
    directory.refund(batch, 10**6)
    assert directory.take(batch, 6000, 0.0) == 0.0
    assert directory.take(batch, 1, 0.0) > 0.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"x-request-timeout-ms": "2500"}, 2.5),
        ({"x-stainless-read-timeout": "600"}, 600.0),
        ({"x-request-timeout-ms": "1500", "x-stainless-read-timeout": "600"}, 1.5),
        ({"x-request-timeout-ms": "soon", "x-stainless-read-timeout": "7.5"}, 7.5),
        ({"x-request-timeout-ms": "-1"}, None),
        ({"x-request-timeout-ms": "inf"}, None),
    ],
)
def test_client_timeout_from_headers(headers: dict[str, str], expected: float | None) -> None:
    assert client_timeout_s(headers, AdmissionConfig()) == expected


def test_deadline_headers_are_configurable() -> None:
    config = AdmissionConfig(deadline_headers=(DeadlineHeader(name="x-deadline", unit="s"),))
    assert client_timeout_s({"x-deadline": "3", "x-request-timeout-ms": "1"}, config) == 3.0


@pytest.mark.parametrize(("gateways", "taken"), [(1, 60000), (2, 30000), (4, 15000)])
def test_each_of_n_gateways_holds_one_nth_of_a_budget(gateways: int, taken: int) -> None:
    directory = directory_of(TenantConfig(name="t", tokens_per_min=60000))
    tenant = directory.identify("k")
    assert tenant is not None
    directory.share(gateways, 0.0)
    assert directory.take(tenant, taken, 0.0) == 0.0
    assert directory.take(tenant, 1, 0.0) > 0.0
    assert directory.take(tenant, 1000, 60.0 / taken * 1000) == 0.0, "refilled at 1/N of the rate"


def test_a_gateway_joining_shrinks_a_bucket_already_in_use_and_leaving_grows_it() -> None:
    directory = directory_of(TenantConfig(name="t", tokens_per_min=60000))
    tenant = directory.identify("k")
    assert tenant is not None
    assert directory.take(tenant, 10000, 0.0) == 0.0
    directory.share(2, 0.0)
    assert directory.take(tenant, 30000, 0.0) == 0.0
    assert directory.take(tenant, 1, 0.0) > 0.0, "what it had, cut to the new capacity"
    directory.share(1, 0.0)
    assert directory.take(tenant, 60000, 60.0) == 0.0
