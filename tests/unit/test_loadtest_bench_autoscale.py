"""The autoscaling benchmark's model mode, cut short after the burst starts: kvgate's policy scales
out on the burst's work while a request-rate scaler, whose count barely moves, does not."""

from pathlib import Path

import pytest

from bench.bench_autoscale.__main__ import main
from bench.bench_autoscale.fluid_fleet import BURST
from bench.bench_autoscale.model_mode import first_time, simulate
from bench.bench_autoscale.scenario import MIN_REPLICAS

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
    out = tmp_path / "model.png"
    assert main(["--mode", "model", "--end-s", str(END_S), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert [line for line in printed.splitlines() if line.startswith("== ")] == [
        "== work",
        "== conjunction",
        "== requests",
    ]
    assert out.stat().st_size > 10_000
