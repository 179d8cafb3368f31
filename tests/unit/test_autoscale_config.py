"""``kvgate autoscale --config``: the file ``kvgate serve`` takes (or only its ``autoscaler:``
section) through the one loader, the admin token from the gateway's own key and variable, and the
older forms read for one release with a warning."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from kvgate.cli.autoscale import admin_token, loop_config, register
from kvgate.cli.command import CommandError
from kvgate.config.loader import EXAMPLES_DIR

GATEWAY = yaml.safe_load((EXAMPLES_DIR / "static.yaml").read_text())


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvgate")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["autoscale", "--gateway", "http://gw", *argv])


def written(tmp_path: Path, document: object) -> str:
    path = tmp_path / "kvgate.yaml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


def token_of(environ: dict[str, str], *argv: str) -> str | None:
    args = parse(*argv)
    return admin_token(args, loop_config(args, environ))


def test_the_gateways_own_file_gives_the_policy_and_the_interval_flag_wins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = {"interval_s": 5, "pools": {"default": {"max_replicas": 3}}}
    path = written(tmp_path, {**GATEWAY, "autoscaler": policy})
    config = loop_config(parse("--config", path), {}).autoscaler
    assert (config.interval_s, config.policy_for("default").max_replicas) == (5.0, 3)
    assert loop_config(parse("--config", path, "--interval-s", "2"), {}).autoscaler.interval_s == 2.0
    overridden = loop_config(parse("--config", path), {"KVGATE_AUTOSCALER__INTERVAL_S": "7"})
    assert overridden.autoscaler.interval_s == 7.0
    assert capsys.readouterr().err == ""


def test_a_file_with_only_the_autoscaler_section_is_a_whole_config(tmp_path: Path) -> None:
    path = written(tmp_path, {"autoscaler": {"policy": {"max_replicas": 4}}})
    assert loop_config(parse("--config", path), {}).autoscaler.policy.max_replicas == 4
    assert loop_config(parse(), {}).autoscaler.interval_s == 15.0, "no file: the defaults"


def test_the_gateways_sections_are_not_the_loops_to_check(tmp_path: Path) -> None:
    """A pool the gateway would refuse, or a tenant key file only gateway pods mount, is no
    problem of the loop's; ``kvgate config check`` reports them."""
    gateway = {**GATEWAY, "pools": [{"name": "p", "replicas": ["not a url"]}]}
    gateway["auth"] = {"tenants": [{"name": "t", "api_keys_file": "/nonexistent/keys"}]}
    assert loop_config(parse("--config", written(tmp_path, gateway)), {}).auth.admin_token is None


def test_every_problem_of_the_loops_part_is_listed_and_an_unknown_key_is_one(tmp_path: Path) -> None:
    document = {"autoscaler": {"policy": {"min_replicas": 9, "max_replicas": 2}}, "autoscaller": {}}
    with pytest.raises(CommandError) as caught:
        loop_config(parse("--config", written(tmp_path, document)), {"KVGATE_AUTOSCALER__INTERVAL_S": "0"})
    message = str(caught.value)
    assert "3 problems" in message and "autoscaller: unknown key" in message
    assert "autoscaler.interval_s" in message and "max_replicas" in message


def test_the_admin_token_comes_from_the_flag_else_the_gateways_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert token_of({}) is None
    assert token_of({"KVGATE_AUTH__ADMIN_TOKEN": "from-env"}) == "from-env"
    assert token_of({"KVGATE_AUTH__ADMIN_TOKEN": "from-env"}, "--admin-token", "from-flag") == "from-flag"
    secret = tmp_path / "admin-token"
    secret.write_text("from-file\n")
    path = written(tmp_path, {**GATEWAY, "auth": {"admin_token_file": str(secret)}})
    assert token_of({}, "--config", path) == "from-file"
    assert capsys.readouterr().err == ""


def test_the_old_token_variables_are_read_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    assert token_of({"KVGATE_ADMIN_TOKEN": "old"}) == "old"
    (line,) = capsys.readouterr().err.splitlines()
    assert (
        line.startswith("kvgate autoscale: warning: KVGATE_ADMIN_TOKEN ")
        and "KVGATE_AUTH__ADMIN_TOKEN" in line
    )
    assert token_of({"KVGATE_SERVER__ADMIN_TOKEN": "older"}) == "older"
    (line,) = capsys.readouterr().err.splitlines()
    assert "server.admin_token" in line and "auth.admin_token" in line
    assert token_of({"KVGATE_ADMIN_TOKEN": "same", "KVGATE_AUTH__ADMIN_TOKEN": "same"}) == "same"
    with pytest.raises(CommandError, match="KVGATE_ADMIN_TOKEN and KVGATE_AUTH__ADMIN_TOKEN are both set"):
        token_of({"KVGATE_ADMIN_TOKEN": "old", "KVGATE_AUTH__ADMIN_TOKEN": "new"})


def test_a_file_that_is_the_autoscaler_section_itself_is_read_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = written(tmp_path, {"interval_s": 5, "pools": {"decode": {"max_replicas": 3}}})
    config = loop_config(parse("--config", path, "--interval-s", "2"), {}).autoscaler
    assert (config.interval_s, config.policy_for("decode").max_replicas) == (2.0, 3)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("kvgate autoscale: warning: ") and "nest it under 'autoscaler:'" in line
    only_pools = written(tmp_path, {"pools": {"decode": {"min_replicas": 2}}})
    assert loop_config(parse("--config", only_pools), {}).autoscaler.policy_for("decode").min_replicas == 2
