from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from kvgate.autoscaler.recommendation import SCALE_OUT_OCCUPANCY_ITL
from kvgate.autoscaler.signals import merge_signals, pool_signals
from kvgate.cli import main
from kvgate.cli.autoscale import register, run_autoscale
from kvgate.config.autoscaler import AutoscalerConfig, PoolPolicy
from kvgate.gateway.telemetry.recommender import GatewayRecommender
from tests.unit.test_metrics import MODEL, FakeClock, populated, samples, value


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvgate")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["autoscale", *argv])


def test_register_adds_the_autoscale_command() -> None:
    args = parse("--gateway", "http://gw:8080", "--actuator", "sim", "--sim-control", "chat=http://sim:9100")
    assert args.run is run_autoscale
    assert (args.gateway, args.actuator, args.sim_control) == (
        ["http://gw:8080"],
        "sim",
        ["chat=http://sim:9100"],
    )


def test_bad_actuator_arguments_exit_with_2_and_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["autoscale", "--gateway", "http://gw", "--actuator", "sim"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("kvgate autoscale: error: ") and "--sim-control" in line
    argv = ["autoscale", "--gateway", "http://gw", "--actuator", "kubernetes", "--deployment", "x"]
    assert main(argv) == 2
    assert "POOL=VALUE" in capsys.readouterr().err


def test_gateway_recommender_publishes_desired_replicas() -> None:
    clock = FakeClock()
    metrics = populated(clock)
    metrics.record_response("decode", MODEL, None, 25.0, (0.5,) * 50)
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


def pool_doc(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "role": "mixed",
        "replicas_current": 2,
        "replicas_ready": 2,
        "replicas_warming": 0,
        "kv_occupancy_estimate_ratio": 0.2,
        "kv_occupancy_scraped_ratio": None,
        "queued_requests": 0,
        "queued_prompt_tokens": 0,
        "pending_prompt_tokens": 0,
        "resident_sequences": 0,
        "remaining_decode_tokens": 0,
        "ttft_p95_s": None,
        "itl_p95_s": None,
        "queue_wait_p95_s": None,
        "e2e_p95_s": None,
        "prompt_tokens_per_s": 0.0,
        "output_tokens_per_s": 0.0,
        "requests_per_s": 0.0,
        "decisions": {},
    }
    return {**base, **fields}


def test_signals_of_several_gateways_add_work_and_rates_and_keep_the_largest_quantiles() -> None:
    """Two gateways sharing one fleet: each holds its own clients' queue and traffic, both see the
    same replicas. The policy must see the fleet's demand, not one gateway's share."""
    a = pool_doc(
        queued_prompt_tokens=1000,
        pending_prompt_tokens=200,
        resident_sequences=3,
        prompt_tokens_per_s=500.0,
        output_tokens_per_s=40.0,
        requests_per_s=2.0,
        ttft_p95_s=0.5,
        kv_occupancy_scraped_ratio=0.6,
        decisions={"admit": 5},
    )
    b = pool_doc(
        queued_prompt_tokens=3000,
        pending_prompt_tokens=100,
        resident_sequences=4,
        prompt_tokens_per_s=1500.0,
        output_tokens_per_s=60.0,
        requests_per_s=3.0,
        ttft_p95_s=2.0,
        itl_p95_s=0.05,
        kv_occupancy_scraped_ratio=0.7,
        replicas_ready=1,
        decisions={"admit": 1, "reject": 2},
    )
    merged = merge_signals([{"time_s": 1.0, "pools": {"chat": a}}, {"time_s": 2.0, "pools": {"chat": b}}])
    chat = merged["pools"]["chat"]
    assert (chat["queued_prompt_tokens"], chat["pending_prompt_tokens"], chat["resident_sequences"]) == (
        4000,
        300,
        7,
    )
    assert (chat["prompt_tokens_per_s"], chat["output_tokens_per_s"], chat["requests_per_s"]) == (
        2000.0,
        100.0,
        5.0,
    )
    assert (chat["ttft_p95_s"], chat["itl_p95_s"], chat["queue_wait_p95_s"]) == (2.0, 0.05, None)
    assert (chat["kv_occupancy_scraped_ratio"], chat["replicas_current"], chat["replicas_ready"]) == (
        0.7,
        2,
        2,
    )
    assert chat["decisions"] == {"admit": 6, "reject": 2}
    assert merged["gateways"] == 2
    (signals,) = pool_signals(merged, 10.0)
    assert signals.prompt_tokens_queued == 4300 and signals.prompt_tokens_per_s == 2000.0


def test_a_pool_only_one_gateway_knows_is_kept() -> None:
    merged = merge_signals([{"pools": {"a": pool_doc(queued_requests=1)}}, {"pools": {"b": pool_doc()}}])
    assert set(merged["pools"]) == {"a", "b"} and merged["pools"]["a"]["queued_requests"] == 1


def test_gateway_urls_must_be_http(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["autoscale", "--gateway", "http://gw", "--gateway", "gw:8080"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--gateway takes an http:// or https:// URL, got 'gw:8080'" in line
    assert main(["autoscale", "--gateway-dns", "kvgate-pods"]) == 2
    assert "--gateway-dns" in capsys.readouterr().err


def test_the_shipped_loop_reads_every_gateway_pod_through_a_headless_service() -> None:
    """The kvgate-loop Deployment resolves a headless Service of the gateway pods (each address is
    one gateway), not the load-balanced kvgate Service, which would answer from one pod per round."""
    folder = Path(__file__).parents[2] / "deploy" / "autoscaling" / "kvgate-loop"
    deployment = yaml.safe_load((folder / "autoscaler-deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = parse(*container["args"][1:])
    assert args.gateway is None
    (url,) = args.gateway_dns
    service = yaml.safe_load((folder / "kvgate-pods-service.yaml").read_text())
    host, port = url.removeprefix("http://").split(":")
    assert host.split(".")[0] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    assert [p["port"] for p in service["spec"]["ports"]] == [int(port)]
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "kvgate"}
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert "kvgate-pods-service.yaml" in kustomization["resources"]
