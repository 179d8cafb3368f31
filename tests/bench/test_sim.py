"""``python -m bench sim`` at a tiny size: the profile's figures on a manual clock, then one simulated
replica in its own process serving two streams, its CPU per streamed token and its lag."""

from pathlib import Path

from bench.sim import main


def test_profile_figures_and_the_cost_of_serving_are_printed(tmp_path: Path) -> None:
    sizes = ["--replicas", "1", "--streams", "2", "--duration-s", "0.2", "--time-scale", "0.1"]
    assert main([*sizes, "--out", str(tmp_path)]) == 0
    printed = (tmp_path / "output.txt").read_text()
    assert printed.startswith("== profile llama-3.1-8b-h100 (simulated time, manual clock)")
    assert printed.count("TTFT ") == 4 and printed.count("ITL batch") == 2
    streamed = next(line for line in printed.splitlines() if line.startswith("streamed tokens"))
    assert float(streamed.split()[2].replace(",", "")) > 0
    assert "CPU per streamed token" in printed and "step-loop lag" in printed
