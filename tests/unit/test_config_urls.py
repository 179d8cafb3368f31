"""Replica base URLs: one check and one normal form, for the config and for ``/admin``."""

from __future__ import annotations

import pytest

from kvgate.config.loader import ConfigError, parse_config
from kvgate.config.urls import replica_base_url


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("http://10.0.0.5:8000", "http://10.0.0.5:8000"),
        ("HTTP://Replica-A.Example:8000/", "http://replica-a.example:8000"),
        ("https://[::1]:8443", "https://[::1]:8443"),
        ("http://vllm", "http://vllm"),
    ],
)
def test_a_good_url_comes_out_in_normal_form(url: str, normal: str) -> None:
    assert replica_base_url(url) == normal


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://x:1\n", "whitespace and control"),
        ("http://x:1\x00", "whitespace and control"),
        ("http://x:1\x7f", "whitespace and control"),
        ("ftp://x:1", "scheme"),
        ("http://x:0", "port"),
        ("http://x:http", "port"),
        ("http://:80", "no host"),
        ("http://u:p@x:1", "credentials"),
        ("http://x:1/v1", "without path"),
        ("http://x:1?", "without path"),
        (8000, "not a string"),
    ],
)
def test_anything_else_is_refused_with_the_reason(url: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        replica_base_url(url)


def test_static_pool_replicas_are_checked_and_normalised_at_load() -> None:
    data = {
        "models": [{"name": "m", "max_model_len": 8192, "kv_bytes_per_token": 131072}],
        "pools": [{"name": "p", "replicas": ["HTTP://A:8000/"], "kv_capacity_tokens": 1000}],
    }
    assert parse_config(data, {}).pools[0].replicas == ("http://a:8000",)
    data["pools"][0]["replicas"] = ["http://a:8000\n"]
    with pytest.raises(ConfigError, match="whitespace and control"):
        parse_config(data, {})
