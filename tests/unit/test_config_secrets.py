"""Secrets in the config: read from files (``*_file``) or the environment, and never printed.

Secrets are ``auth.admin_token``, ``auth.observability_token``, ``auth.tenants[].api_keys``,
``coordination.redis_url`` and ``pools[].api_key``. pydantic echoes each bad input in its
errors; the loader must not, wherever the secret sits (the bad field itself, a section a
cross-field check rejects, the whole document, an unknown key, a YAML syntax error)."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.cli import main
from kvgate.config.loader import ConfigError, load_config, parse_config

SECRETS = ("s3cret-admin", "s3cret-scrape", "hunter2", "sk-pool-s3cret", "sk-tenant-s3cret")


def document(**server: Any) -> dict[str, Any]:
    return {
        "server": dict(server),
        "auth": {
            "enabled": True,
            "admin_token": "s3cret-admin",
            "observability_token": "s3cret-scrape",
            "tenants": [{"name": "t", "api_keys": ["sk-tenant-s3cret"]}],
        },
        "coordination": {"redis_url": "redis://:hunter2@redis:6379/0"},
        "models": [{"name": "m", "max_model_len": 8192, "kv_bytes_per_token": 131072}],
        "pools": [
            {
                "name": "p",
                "replicas": ["http://127.0.0.1:9100"],
                "kv_capacity_tokens": 1000,
                "api_key": "sk-pool-s3cret",
            }
        ],
    }


def error_text(data: dict[str, Any], environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, environ or {})
    return "".join(traceback.format_exception(caught.value))


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, (secret, text)


def test_a_good_config_keeps_its_secrets_out_of_its_repr() -> None:
    config = parse_config(document(), {})
    assert config.auth.admin_token is not None
    assert config.auth.admin_token.get_secret_value() == "s3cret-admin"
    assert (
        config.pools[0].api_key is not None and config.pools[0].api_key.get_secret_value() == "sk-pool-s3cret"
    )
    assert [k.get_secret_value() for k in config.auth.tenants[0].api_keys] == ["sk-tenant-s3cret"]
    assert_no_secret(repr(config) + str(config.model_dump()))


def test_validation_errors_never_show_a_secret() -> None:
    bad = document(port=-1)
    bad["coordination"]["lease_s"] = 0
    bad["pools"][0]["dns"] = {"name": "vllm.svc"}
    bad["auth"]["tenants"].append({"name": "t", "api_keys": ["sk-tenant-s3cret"]})
    bad["server"]["admin_tokn"] = "s3cret-admin"
    text = error_text(bad)
    assert "server.port" in text and "coordination.lease_s" in text and "exactly one of replicas" in text
    assert "server.admin_tokn: unknown key" in text and "already belongs to 't'" in text
    assert_no_secret(text)
    wrong_types = document()
    wrong_types["auth"]["admin_token"] = ["s3cret-admin"]
    wrong_types["pools"][0]["api_key"] = {"value": "sk-pool-s3cret"}
    text = error_text(wrong_types)
    assert "auth.admin_token" in text and "pools.0.api_key" in text
    assert_no_secret(text)
    no_models = document()
    no_models["models"] = []
    text = error_text(no_models)
    assert "at least one model" in text
    assert_no_secret(text)
    text = error_text(document(), {"KVGATE_AUTH__ADMIN_TOKN": "s3cret-admin", "KVGATE_X__0__Y": "hunter2"})
    assert "admin_tokn" in text
    assert_no_secret(text)


def test_all_digit_keys_from_the_environment_are_text() -> None:
    environ = {"KVGATE_POOLS__0__API_KEY": "1234", "KVGATE_AUTH__TENANTS__0__API_KEYS": "[5678]"}
    config = parse_config(document(), environ)
    assert config.pools[0].api_key is not None and config.pools[0].api_key.get_secret_value() == "1234"
    assert [k.get_secret_value() for k in config.auth.tenants[0].api_keys] == ["5678"]


def test_a_pool_api_key_that_would_break_its_header_is_refused_unseen() -> None:
    bad = document()
    bad["pools"][0]["api_key"] = "sk-pool-s3cret\r\nx-injected: 1"
    text = error_text(bad)
    assert "pools.0.api_key" in text and "visible ASCII" in text
    assert_no_secret(text)


def test_config_check_prints_no_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(document()))
    assert main(["config", "check", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(document(port=-1)))
    assert main(["config", "check", str(bad)]) == 2
    unparsable = tmp_path / "unparsable.yaml"
    unparsable.write_text('auth:\n  admin_token: "s3cret-admin\n  enabled: [1\n')
    assert main(["config", "check", str(unparsable)]) == 2
    out = capsys.readouterr()
    assert "ok (1 model(s)" in out.out and "server.port" in out.err and "unparsable.yaml" in out.err
    assert_no_secret(out.out + out.err)


def test_secrets_come_from_files_without_their_trailing_newline(tmp_path: Path) -> None:
    def secret_file(name: str, text: str) -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    data = document()
    del data["auth"]["admin_token"], data["coordination"]["redis_url"], data["pools"][0]["api_key"]
    del data["auth"]["tenants"][0]["api_keys"]
    data["auth"]["admin_token_file"] = secret_file("admin", "from-file-admin\n")
    data["coordination"]["redis_url_file"] = secret_file("redis", "redis://:pw@r:6379/0\n")
    data["pools"][0]["api_key_file"] = secret_file("pool", "from-file-pool")
    data["auth"]["tenants"][0]["api_keys_file"] = secret_file("tenant", "sk-one\n\n  sk-two  \n")
    config = parse_config(data, {})
    assert config.auth.admin_token is not None
    assert config.auth.admin_token.get_secret_value() == "from-file-admin"
    assert config.coordination is not None
    assert config.coordination.redis_url.get_secret_value() == "redis://:pw@r:6379/0"
    assert (
        config.pools[0].api_key is not None and config.pools[0].api_key.get_secret_value() == "from-file-pool"
    )
    assert [k.get_secret_value() for k in config.auth.tenants[0].api_keys] == ["sk-one", "sk-two"]


def test_environment_overrides_set_secrets_and_their_files(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("env-file-token\n")
    data = document()
    del data["auth"]["admin_token"]
    config = parse_config(data, {"KVGATE_AUTH__ADMIN_TOKEN_FILE": str(token)})
    assert config.auth.admin_token is not None
    assert config.auth.admin_token.get_secret_value() == "env-file-token"


def test_a_secret_file_that_cannot_be_read_is_named_and_a_secret_given_twice_is_refused(
    tmp_path: Path,
) -> None:
    data = document()
    del data["auth"]["admin_token"]
    missing = tmp_path / "no-such-token"
    data["auth"]["admin_token_file"] = str(missing)
    text = error_text(data)
    assert "admin_token_file: cannot read" in text and str(missing) in text
    assert_no_secret(text)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    data["auth"]["admin_token_file"] = str(empty)
    assert "is empty" in error_text(data)
    twice = document()
    twice["pools"][0]["api_key_file"] = str(empty)
    text = error_text(twice)
    assert "api_key or api_key_file" in text
    assert_no_secret(text)


def test_an_unreadable_yaml_file_is_named_not_quoted(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("auth: {admin_token: s3cret-admin\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={})
    text = "".join(traceback.format_exception(caught.value))
    assert str(path) in text and "line" in text
    assert_no_secret(text)
