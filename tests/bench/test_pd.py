"""``python -m bench pd``, one short trace on two simulated GPUs per target: a mixed fleet and a
prefill/decode pair, each behind kvgate, a row each against the mixed one, table and plot in ``--out``."""

from pathlib import Path

from bench.pd.__main__ import main


def test_mixed_and_disaggregated_play_one_trace(tmp_path: Path) -> None:
    sizes = ["--gpus", "2", "--prefill", "1", "--rate", "3", "--duration-s", "1", "--slices", "1"]
    args = [*sizes, "--traces", "decode-heavy", "--time-scale", "0.1"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    rows = [
        line.split("|")
        for line in (tmp_path / "pd.md").read_text().splitlines()
        if "| decode-heavy |" in line
    ]
    by_target = {row[2].strip(): row for row in rows}
    assert {"kvgate mixed", "kvgate P/D"} <= set(by_target)
    for row in by_target.values():
        requests, ok = int(row[3]), int(row[4])
        assert requests > 0 and ok == requests
    assert by_target["kvgate mixed"][13].strip() == "1.00x"  # TTFT p95 against itself
    assert (tmp_path / "pd.png").stat().st_size > 0
