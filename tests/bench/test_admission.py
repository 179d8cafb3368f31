"""``python -m bench admission``, half a second of arrivals on a fast simulator: the same schedule
through a gateway with admission on and one with it off, a row each in the printed table."""

from pathlib import Path

from bench.admission import main


def test_both_phases_play_the_same_arrivals_and_are_tabled(tmp_path: Path) -> None:
    sizes = ["--duration-s", "0.5", "--overload", "0.5", "--time-scale", "0.1"]
    assert main([*sizes, "--out", str(tmp_path)]) == 0
    printed = (tmp_path / "output.txt").read_text().splitlines()
    header = next(i for i, line in enumerate(printed) if line.startswith("phase "))
    kvgate, off = (line.split() for line in printed[header + 1 : header + 3])
    assert kvgate[0] == "kvgate" and off[:2] == ["admission", "off"]
    assert int(kvgate[1]) == int(off[2]) > 0  # the same requests sent
    assert int(kvgate[2]) > 0 and int(off[3]) > 0  # admitted
    assert kvgate[-1] == off[-1] == "0"  # no errors
