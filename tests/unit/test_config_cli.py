"""``kvgate config check FILE``: exit 0 and a summary, or exit 2 and every problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.cli import build_parser, main
from kvgate.config.loader import EXAMPLES_DIR


def test_check_accepts_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", str(EXAMPLES_DIR / "static.yaml")]) == 0
    assert "ok (1 model(s), 1 pool(s), 4 static replica(s), 0 DNS pool(s))" in capsys.readouterr().out


def test_check_lists_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: {port: -1}\nmodels: []\npools: []\nhealth: {interval_s: 0}\n")
    assert main(["config", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "server.port" in err and "health.interval_s" in err and "(unit: seconds)" in err


def test_subcommands_are_registered() -> None:
    parser = build_parser()
    assert parser.parse_args(["up", "--replicas", "3", "--port", "9000"]).replicas == 3
    assert parser.parse_args(["serve", "--config", "x.yaml"]).config == "x.yaml"


def test_check_accepts_a_pool_that_discovers_its_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "discovered.yaml"
    config.write_text(
        "models: [{name: m, max_model_len: 8192, kv_bytes_per_token: 131072}]\n"
        "pools: [{name: p, replicas: ['http://127.0.0.1:9100']}]\n"
    )
    assert main(["config", "check", str(config)]) == 0
    assert "ok (1 model(s), 1 pool(s), 1 static replica(s), 0 DNS pool(s))" in capsys.readouterr().out


def test_up_runs_the_autoscaler_unless_told_not_to() -> None:
    parser = build_parser()
    args = parser.parse_args(["up"])
    assert (args.autoscale, args.min_replicas, args.max_replicas, args.autoscale_interval_s) == (
        True,
        1,
        8,
        5.0,
    )
    assert parser.parse_args(["up", "--no-autoscale"]).autoscale is False


def test_serve_flags_override_the_file_and_the_environment() -> None:
    args = build_parser().parse_args(["serve", "--config", "x.yaml", "--host", "0.0.0.0", "--port", "9000"])
    assert (args.host, args.port) == ("0.0.0.0", 9000)
    assert build_parser().parse_args(["serve", "--config", "x.yaml"]).port is None
