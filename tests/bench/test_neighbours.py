"""``python -m bench neighbours`` at a tiny size: small clients through a real gateway, quiet and
beside a huge prompt, and the event-loop stall of this checkout's prompt encoder in a child."""

from pathlib import Path

from bench.neighbours.__main__ import main


def test_quiet_and_huge_phases_are_measured_and_summed_up_per_shape(tmp_path: Path) -> None:
    sizes = ["--rounds", "1", "--phase-s", "0.5", "--variant", "over", "--size-mb", "0.6"]
    assert main([*sizes, "--shape", "all", "--out", str(tmp_path)]) == 0
    printed = (tmp_path / "output.txt").read_text().splitlines()
    summary = [line.split() for line in printed if line.startswith("over ") and "round" not in line]
    assert [row[1:4:2] for row in summary] == [
        [shape, phase] for shape in ("words", "short-words", "letters") for phase in ("quiet", "huge")
    ]
    assert all(int(row[4]) > 0 for row in summary)
    assert not any(line.startswith("small requests not answered 200") for line in printed)
    refused = [line for line in printed if line.startswith("round") and " huge " in line]
    assert len(refused) == 3 and all("x 400" in line and "x 200" not in line for line in refused)


def test_the_encoder_stall_is_measured_in_a_child_per_variant(tmp_path: Path) -> None:
    assert main(["--loop-lag", "--rounds", "1", "--prompts", "1", "--out", str(tmp_path)]) == 0
    printed = (tmp_path / "output.txt").read_text().splitlines()
    table = [line.split() for line in printed[printed.index("") + 2 :]]
    assert [(row[0], row[1], row[3]) for row in table] == [("over", "words", "1"), ("fits", "words", "1")]
