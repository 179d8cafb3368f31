"""``python -m bench chaos``, one storm of four clients: a real fleet and gateway, the clients hang
up at once mid-stream, every invariant checked and written into ``--out``."""

from pathlib import Path

import orjson

from bench.chaos.__main__ import main


def test_a_small_storm_passes_every_check_and_writes_its_results(tmp_path: Path) -> None:
    assert main(["--only", "storm_streaming", "--clients", "4", "--out", str(tmp_path)]) == 0
    results = orjson.loads((tmp_path / "results.json").read_bytes())
    assert (results["checks_failed"], results["checks_total"]) == (0, 5)
    (scenario,) = results["scenarios"]
    assert scenario["figures"]["outcomes"] == {"left_by_client": 4}
    table = (tmp_path / "results.md").read_text()
    assert "**5/5 checks pass**" in table and "| work gauges back to 0 | PASS |" in table
    assert (tmp_path / "logs" / "storm_streaming.log").exists()
    assert "0 check(s) failed of 5" in (tmp_path / "output.txt").read_text()


def test_an_unknown_scenario_is_refused_before_anything_starts(tmp_path: Path) -> None:
    assert main(["--only", "storm,slowloris", "--out", str(tmp_path)]) == 2
