"""``python -m bench goodput``, two policies on a short trace: a fleet child and a gateway per policy,
the trace played through both in a slice, the table and the plot written into ``--out``."""

from pathlib import Path

from bench.goodput.__main__ import main


def test_two_policies_play_one_trace_and_are_set_against_round_robin(tmp_path: Path) -> None:
    sizes = ["--replicas", "1", "--rate", "6", "--duration-s", "1", "--slices", "1", "--time-scale", "0.1"]
    args = [*sizes, "--policies", "kvgate,round_robin", "--peers", "none", "--out", str(tmp_path)]
    assert main(args) == 0
    printed = (tmp_path / "output.txt").read_text()
    rows = {line.split()[0]: line.split() for line in printed.split("SLO:")[1].splitlines()[2:4]}
    assert set(rows) == {"kvgate", "round_robin"}
    for row in rows.values():
        assert int(row[1]) > 0 and int(row[2]) == int(row[1])  # requests, all ok
    assert "against round_robin" in printed and "kvgate             goodput" in printed
    assert [line.split()[:2] for line in printed.splitlines() if " simulator " in line] == [
        ["kvgate", "simulator"],
        ["round_robin", "simulator"],
    ]
    assert (tmp_path / "goodput.png").stat().st_size > 0
    assert {path.name for path in tmp_path.glob("gateway-*.yaml")} == {
        "gateway-kvgate.yaml",
        "gateway-round_robin.yaml",
    }
