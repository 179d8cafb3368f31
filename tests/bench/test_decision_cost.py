"""``python -m bench decision_cost``, one short round: the four settings on the real decision path,
each with its p50 set against the gateway alone."""

from pathlib import Path

from bench.decision_cost import main


def test_every_setting_is_timed_against_the_gateway_alone(tmp_path: Path) -> None:
    assert main(["--rounds", "1", "--decisions", "50", "--replicas", "4", "--out", str(tmp_path)]) == 0
    rows = [line.split("|") for line in (tmp_path / "output.txt").read_text().splitlines()]
    table = {row[1].strip(): row for row in rows if len(row) == 6 and row[1].strip()[:1] == "1"}
    assert list(table) == [
        "1 gateway, no Redis",
        "1 of 2 with claims",
        "1 of 4 with claims",
        "1 gateway, itl_slo_s",
    ]
    assert table["1 gateway, no Redis"][4].strip() == "1.00x"
    assert all(float(row[2]) > 0 for row in table.values())
