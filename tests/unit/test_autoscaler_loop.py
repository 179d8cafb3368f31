from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from autoscaler.policy import SCALE_OUT_OCCUPANCY_ITL
from config.autoscaler import AutoscalerConfig, PoolPolicy
from gateway.autoscale_loop import GatewayRecommender, load_autoscaler_config, register, run_autoscale
from tests.unit.test_metrics import MODEL, FakeClock, populated, samples, value


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvgate")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["autoscale", *argv])


def test_register_adds_the_autoscale_command() -> None:
    args = parse("--gateway", "http://gw:8080", "--actuator", "sim", "--sim-control", "chat=http://sim:9100")
    assert args.run is run_autoscale
    assert (args.gateway, args.actuator, args.sim_control) == (
        "http://gw:8080",
        "sim",
        ["chat=http://sim:9100"],
    )


def test_the_admin_token_comes_from_the_flag_or_else_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    base = ("--gateway", "http://gw", "--actuator", "sim", "--sim-control", "default=http://sim:9100")
    monkeypatch.delenv("KVGATE_ADMIN_TOKEN", raising=False)
    assert parse(*base).admin_token is None
    monkeypatch.setenv("KVGATE_ADMIN_TOKEN", "from-env")
    assert parse(*base).admin_token == "from-env"
    assert parse(*base, "--admin-token", "from-flag").admin_token == "from-flag"


def test_bad_actuator_arguments_exit_with_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_autoscale(parse("--gateway", "http://gw", "--actuator", "sim")) == 2
    assert "--sim-control" in capsys.readouterr().err
    assert (
        run_autoscale(parse("--gateway", "http://gw", "--actuator", "kubernetes", "--deployment", "x")) == 2
    )
    assert "POOL=VALUE" in capsys.readouterr().err


def test_config_file_and_interval_override(tmp_path: Path) -> None:
    path = tmp_path / "autoscaler.yaml"
    path.write_text("interval_s: 5\npools:\n  decode:\n    max_replicas: 3\n")
    config = load_autoscaler_config(str(path), interval_s=2.0)
    assert config.interval_s == 2.0
    assert config.policy_for("decode").max_replicas == 3
    with pytest.raises(ValueError, match="max_replicas"):
        path.write_text("policy:\n  min_replicas: 9\n  max_replicas: 2\n")
        load_autoscaler_config(str(path), None)


def test_gateway_recommender_publishes_desired_replicas() -> None:
    clock = FakeClock()
    metrics = populated(clock)
    for _ in range(50):
        metrics.observe_itl("decode", MODEL, 0.5)
    config = AutoscalerConfig(policy=PoolPolicy(scale_out_window_s=30, scale_out_occupancy_ratio=0.75))
    recommender = GatewayRecommender(metrics, config, clock=clock)
    recommender.recommend()
    clock.now_s += 30
    by_pool = {r.pool: r for r in recommender.recommend()}
    assert (by_pool["decode"].desired_replicas, by_pool["decode"].reason) == (3, SCALE_OUT_OCCUPANCY_ITL)
    series = samples(metrics)
    assert value(series, "kvgate_autoscaler_desired_replicas", pool="decode") == 3
    assert (
        value(series, "kvgate_autoscaler_decision_info", pool="decode", reason=SCALE_OUT_OCCUPANCY_ITL) == 1
    )
    assert value(series, "kvgate_autoscaler_desired_replicas", pool="prefill") == 1
