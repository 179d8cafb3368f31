"""``kvgate config check``: what it passes starts, and what would be wrong silently is refused.

Entries keyed by a model or pool that does not exist, every bad replica URL at once, a check
without the secret files mounted (``--no-secrets``), and a tokeniser that would not load at start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvgate.cli import main
from kvgate.cli.command import CommandError
from kvgate.cli.serve import load
from kvgate.config.loader import ConfigError, parse_config

MODEL = {"name": "m", "max_model_len": 8192, "kv_bytes_per_token": 131072}


def document(**extra: Any) -> dict[str, Any]:
    return {"models": [dict(MODEL)], "pools": [{"name": "p", "replicas": ["http://127.0.0.1:9100"]}], **extra}


def check(tmp_path: Path, data: dict[str, Any], *flags: str) -> tuple[int, str]:
    path = tmp_path / "kvgate.yaml"
    path.write_text(yaml.safe_dump(data))
    code = main(["config", "check", *flags, str(path)])
    return code, str(path)


def test_admission_rules_for_a_model_that_does_not_exist_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"admission.models.llama: not a configured model \['m'\]"):
        parse_config(document(admission={"models": {"llama": {"max_tokens_policy": "reject"}}}), {})


def test_an_autoscaler_policy_for_a_pool_that_does_not_exist_is_refused() -> None:
    data = document(autoscaler={"pools": {"decode": {"max_replicas": 4}, "p": {"max_replicas": 2}}})
    expected = r"autoscaler.pools.decode: not a configured pool \['p'\]"
    with pytest.raises(ConfigError, match=expected) as caught:
        parse_config(data, {})
    assert "autoscaler.pools.p" not in str(caught.value)


def test_every_bad_replica_url_is_reported_at_once() -> None:
    data = document()
    data["pools"] = [
        {"name": "a", "replicas": ["http://ok:8000", "ftp://x:1", "http://x:1/v1"]},
        {"name": "b", "replicas": ["http://u:p@y:1"]},
    ]
    with pytest.raises(ConfigError) as caught:
        parse_config(data, {})
    keys = sorted(problem.key for problem in caught.value.problems)
    assert keys == ["pools.0.replicas.1", "pools.0.replicas.2", "pools.1.replicas.0"]
    text = str(caught.value)
    assert "scheme" in text and "without path" in text and "credentials" not in text.split("pools.1")[0]


def secret_files_document(tmp_path: Path) -> dict[str, Any]:
    missing = tmp_path / "not-mounted"
    return document(
        auth={
            "enabled": True,
            "admin_token_file": str(missing / "admin"),
            "observability_token_file": str(missing / "metrics"),
            "tenants": [
                {"name": "a", "api_keys_file": str(missing / "a-keys")},
                {"name": "b", "api_keys_file": str(missing / "b-keys")},
            ],
        },
        coordination={"redis_url_file": str(missing / "redis")},
        pools=[{"name": "p", "replicas": ["http://127.0.0.1:9100"], "api_key_file": str(missing / "vllm")}],
    )


def test_no_secrets_checks_a_file_whose_secrets_are_not_mounted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = secret_files_document(tmp_path)
    assert check(tmp_path, data)[0] == 2
    assert "cannot read" in capsys.readouterr().err
    assert check(tmp_path, data, "--no-secrets")[0] == 0
    assert "ok (1 model(s)" in capsys.readouterr().out


def test_no_secrets_still_runs_every_other_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = secret_files_document(tmp_path)
    data["auth"]["tenants"][1]["api_keys_file"] = data["auth"]["tenants"][0]["api_keys_file"]
    data["server"] = {"port": -1}
    assert check(tmp_path, data, "--no-secrets")[0] == 2
    err = capsys.readouterr().err
    assert "server.port" in err and "already belongs to 'a'" in err


def test_a_huggingface_tokenizer_that_would_not_load_fails_the_check_not_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = document()
    data["models"][0]["tokenizer"] = {"kind": "huggingface", "path": str(tmp_path / "tokenizer.json")}
    code, path = check(tmp_path, data)
    assert code == 2
    assert "models.0.tokenizer (m)" in capsys.readouterr().err
    assert main(["serve", "--config", path, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "tokenizer.json does not exist" in err and "Traceback" not in err


def test_a_huggingface_tokenizer_that_passes_the_check_loads_as_serve_loads_it(tmp_path: Path) -> None:
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text(
        json.dumps(
            {
                "version": "1.0",
                "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "hi": 1}, "unk_token": "[UNK]"},
                "pre_tokenizer": {"type": "Whitespace"},
            }
        )
    )
    data = document()
    data["models"][0]["tokenizer"] = {"kind": "huggingface", "path": str(tokenizer)}
    path = tmp_path / "kvgate.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["config", "check", str(path)]) == 0
    assert load(str(path)).models[0].tokenizer.kind == "huggingface"
    tokenizer.write_text("{not json")
    with pytest.raises(CommandError, match=r"is not a Hugging Face tokenizer\.json"):
        load(str(path))
