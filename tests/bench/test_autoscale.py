"""``python -m bench autoscale``: the model mode cut short after the burst starts (kvgate's policy
scales out on the burst's work while a request-rate scaler, whose count barely moves, does not),
and the real mode at a tiny size (simulator, gateway, actuator loop and load as real processes)."""

from pathlib import Path

import orjson
import pytest

from bench.autoscale.__main__ import main
from bench.autoscale.fluid_fleet import BURST
from bench.autoscale.model_mode import first_time, simulate
from bench.autoscale.scenario import MIN_REPLICAS

END_S = BURST[0] + 300.0


def test_the_policy_scales_out_on_the_burst_and_the_request_rate_scaler_does_not() -> None:
    work, _ = simulate("work", END_S, cold_start_s=120.0, seed=1)
    requests, _ = simulate("requests", END_S, cold_start_s=120.0, seed=1)
    scaled_out = first_time(work, lambda i: work.replicas[i] > MIN_REPLICAS, BURST[0])
    assert scaled_out is not None and scaled_out - BURST[0] <= 60.0
    assert max(requests.replicas) == MIN_REPLICAS


def test_model_mode_prints_every_scaler_and_writes_the_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--mode", "model", "--end-s", str(END_S), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert [line for line in printed.splitlines() if line.startswith("== ")] == [
        "== work",
        "== conjunction",
        "== requests",
    ]
    assert (tmp_path / "model.png").stat().st_size > 10_000


def test_real_mode_closes_the_loop_with_real_processes(tmp_path: Path) -> None:
    sizes = ["--warm-s", "0.5", "--burst-s", "1", "--tail-s", "0.5", "--base-rps", "3"]
    assert main(["--mode", "real", "--scalers", "kvgate", *sizes, "--out", str(tmp_path)]) == 0
    figures = orjson.loads((tmp_path / "figures.json").read_bytes())["kvgate"]
    assert figures["requests"] > 0 and figures["errors"] == 0
    assert figures["peak_desired"] >= MIN_REPLICAS
    assert (tmp_path / "real.png").stat().st_size > 0
    assert "kvgate-gateway.yaml" in {path.name for path in tmp_path.iterdir()}
