"""Auth keys at their old places (``server.*``, ``admission.*``): read for one release as the new
``auth.*`` keys, one warning per old key naming both, and an error naming both when the old and
the new place disagree."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.cli import main
from kvgate.config.gateway import GatewayConfig
from kvgate.config.loader import EXAMPLES_DIR, ConfigError, parse_config
from kvgate.config.renames import MOVED, variable

BASE: dict[str, Any] = {
    "models": [{"name": "m", "max_model_len": 8192, "kv_bytes_per_token": 131072}],
    "pools": [{"name": "p", "replicas": ["http://127.0.0.1:9100"], "kv_capacity_tokens": 1000}],
}
VALUES = {
    "admin_token": "s3cret-admin",
    "observability_token": "s3cret-scrape",
    "protect_observability": True,
    "forward_client_credentials": True,
    "enabled": True,
}
KEYED = {"auth": {"tenants": [{"name": "t", "api_keys": ["sk-t"]}]}}
"""Auth on needs a tenant with a key: given at the new place, so it is no old key of its own."""


def with_key(key: str, value: Any, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """``data`` (default ``BASE``) with ``value`` at ``key`` (``section.name``)."""
    section, name = key.split(".")
    document: dict[str, Any] = yaml.safe_load(yaml.safe_dump({**BASE, **(data or {})}))
    document.setdefault(section, {})[name] = value
    return document


def load(data: dict[str, Any], environ: dict[str, str] | None = None) -> tuple[GatewayConfig, list[str]]:
    warnings: list[str] = []
    return parse_config(data, environ or {}, "<test>", warnings.append), warnings


def file_value(path: Path) -> str:
    path.write_text("s3cret-from-file\n")
    return str(path)


@pytest.mark.parametrize(("old", "new"), MOVED)
def test_an_old_key_is_read_as_the_new_one_with_one_warning_naming_both(
    old: str, new: str, tmp_path: Path
) -> None:
    name = new.split(".")[1]
    value = file_value(tmp_path / "secret") if name.endswith("_file") else VALUES[name]
    config, warnings = load(with_key(old, value, KEYED))
    expected, none = load(with_key(new, value, KEYED))
    assert config == expected and none == []
    (warning,) = warnings
    assert old in warning and new in warning and variable(new) in warning


def test_an_old_variable_moves_with_its_key() -> None:
    config, warnings = load(BASE, {"KVGATE_SERVER__ADMIN_TOKEN": "1234"})
    assert config.auth.admin_token is not None and config.auth.admin_token.get_secret_value() == "1234"
    (warning,) = warnings
    assert "KVGATE_SERVER__ADMIN_TOKEN" in warning and "KVGATE_AUTH__ADMIN_TOKEN" in warning


def test_the_tenants_keys_move_to_the_auth_entry_of_their_name(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("sk-b1\nsk-b2\n")
    admission = {
        "auth_enabled": True,
        "tenants": [
            {"name": "chat", "api_keys": ["sk-chat"], "weight": 2},
            {"name": "batch", "api_keys_file": str(keys_file), "tokens_per_min": 40000},
        ],
    }
    config, warnings = load({**BASE, "admission": admission})
    assert config.auth.enabled
    keys = {t.name: [k.get_secret_value() for k in t.api_keys] for t in config.auth.tenants}
    assert keys == {"chat": ["sk-chat"], "batch": ["sk-b1", "sk-b2"]}
    assert [(t.name, t.weight, t.tokens_per_min) for t in config.admission.tenants] == [
        ("chat", 2.0, None),
        ("batch", 1.0, 40000),
    ]
    assert len(warnings) == 3, warnings
    assert any("admission.auth_enabled" in w and "auth.enabled" in w for w in warnings)
    assert any("admission.tenants[].api_keys " in w and "(chat)" in w for w in warnings)
    assert any("admission.tenants[].api_keys_file" in w and "(batch)" in w for w in warnings)


def test_old_and_new_places_agreeing_load_and_still_warn() -> None:
    data = with_key("server.admin_token", "s3cret-admin", {"auth": {"admin_token": "s3cret-admin"}})
    data["admission"] = {"tenants": [{"name": "t", "api_keys": ["sk-t"]}]}
    data["auth"]["tenants"] = [{"name": "t", "api_keys": ["sk-t"]}]
    config, warnings = load(data)
    assert config.auth.admin_token is not None and len(config.auth.tenants) == 1
    assert len(warnings) == 2


def test_old_and_new_places_disagreeing_is_an_error_naming_both_and_showing_neither() -> None:
    data = with_key("server.admin_token", "s3cret-old", {"auth": {"admin_token": "s3cret-new"}})
    data["admission"] = {"auth_enabled": False, "tenants": [{"name": "t", "api_keys": ["sk-old"]}]}
    data["auth"].update(enabled=True, tenants=[{"name": "t", "api_keys": ["sk-new"]}])
    with pytest.raises(ConfigError) as caught:
        load(data)
    problems = {p.key: str(p) for p in caught.value.problems}
    assert set(problems) == {"server.admin_token", "admission.auth_enabled", "admission.tenants.t.api_keys"}
    assert "auth.admin_token" in problems["server.admin_token"]
    assert "auth.enabled" in problems["admission.auth_enabled"]
    assert "auth.tenants.t.api_keys" in problems["admission.tenants.t.api_keys"]
    text = "".join(traceback.format_exception(caught.value))
    assert not any(secret in text for secret in ("s3cret-old", "s3cret-new", "sk-old", "sk-new"))


def test_a_tenant_admission_prices_but_no_key_names_is_an_error() -> None:
    data = {**BASE, "admission": {"tenants": [{"name": "serach", "weight": 2}]}, **KEYED}
    with pytest.raises(ConfigError, match=r"admission\.tenants\.serach: no auth\.tenants entry"):
        load(data)


def test_the_warnings_go_to_the_project_log_by_default(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="kvgate.config"):
        parse_config(with_key("server.forward_client_credentials", True), {})
    (record,) = caplog.records
    assert record.name == "kvgate.config" and "auth.forward_client_credentials" in record.getMessage()


def test_config_check_prints_each_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(with_key("server.admin_token", "s3cret-admin")))
    assert main(["config", "check", str(path)]) == 0
    out = capsys.readouterr()
    (line,) = out.err.splitlines()
    assert line.startswith("kvgate config check: warning: server.admin_token ") and "auth.admin_token" in line
    assert "s3cret-admin" not in out.out + out.err


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES_DIR.glob("*.yaml")))
def test_the_examples_use_no_old_key(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    # production.yaml's secrets are files a pod mounts
    assert main(["config", "check", "--no-secrets", str(EXAMPLES_DIR / example)]) == 0
    assert capsys.readouterr().err == ""
