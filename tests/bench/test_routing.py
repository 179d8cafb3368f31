"""``python -m bench routing`` at small fleets: a decision time per policy and fleet size, and the
prefix index's memory per replica."""

from pathlib import Path

from bench.routing import main


def test_every_policy_is_timed_at_every_fleet_size(tmp_path: Path) -> None:
    sizes = ["--decisions", "20", "--repeats", "1", "--capacity-blocks", "200", "--fleet-sizes", "10,50"]
    assert main([*sizes, "--out", str(tmp_path)]) == 0
    printed = (tmp_path / "output.txt").read_text().splitlines()
    assert printed[1].split() == ["policy", "10", "replicas", "50", "replicas"]
    policies = ["kvgate (sample 16)", "kvgate (exact)", "round_robin", "least_request"]
    assert [line[:22].strip() for line in printed[2:6]] == policies
    assert all(line.count("/") == 2 for line in printed[2:6])
    assert printed[6].startswith("prefix index memory: ") and "at 200 blocks" in printed[6]
