"""``python -m bench coordination``, two gateways on a short schedule and a fast simulator: a private
Redis, the phase with claims and the one without, a row each in the table and the plot."""

from pathlib import Path

import pytest

from bench.coordination.__main__ import main


@pytest.mark.usefixtures("redis_server")
def test_two_gateways_with_and_without_claims_are_tabled(tmp_path: Path) -> None:
    sizes = ["--gateways", "2", "--duration-s", "0.5", "--overload", "0.5", "--time-scale", "0.1"]
    assert main([*sizes, "--out", str(tmp_path)]) == 0
    rows = [line for line in (tmp_path / "output.txt").read_text().splitlines() if line.startswith("| 2 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["on", "off"]
    claims, alone = ([cell.strip() for cell in row.split("|")] for row in rows)
    assert claims[5] == alone[5] == "0"  # no preemptions
    assert float(claims[12]) > 0 and float(alone[12]) == 0  # syncs with Redis only with claims
    assert (tmp_path / "coordination.png").stat().st_size > 0
