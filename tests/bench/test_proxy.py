"""``python -m bench proxy``, cut to a few requests: backends and gateway as their own processes,
every part timed, the report written over an old one whose one-off section it keeps; and the
rotation against other routers, with a gateway from another checkout as the only other target."""

from pathlib import Path

import pytest

from bench.harness.cli import OUTPUT_FILE
from bench.harness.report import ONE_OFF_HEADING
from bench.proxy.__main__ import main

CHECKOUT = Path(__file__).resolve().parents[2]


def test_report_measures_every_part_and_keeps_the_one_off_section(tmp_path: Path) -> None:
    report = tmp_path / "proxy-report.md"
    report.write_text(f"# Proxy benchmark\n\nstale figures\n\n{ONE_OFF_HEADING}\n\nkept: 42 µs\n")
    sizes = ["--concurrency", "4", "--requests", "16", "--only", "non-stream,serial"]
    parts = ["--decisions", "200", "--client", "200", "--access-log", "200", "--tracing", "50"]
    assert main([*sizes, *parts, "--report", str(report), "--out", str(tmp_path / "out")]) == 0
    text = report.read_text()
    assert "stale figures" not in text
    assert text.endswith(f"{ONE_OFF_HEADING}\n\nkept: 42 µs\n")
    for row in ("| non-stream | 16 |", "| non-stream serial (c=1) | 2 |", "| 200 |", "| `ReplicaClient` |"):
        assert row in text
    for part in ("kvgate, json", "kvgate, text (logfmt) |", "sampled: four SDK spans |", "sampled out"):
        assert part in text
    printed = (tmp_path / "out" / OUTPUT_FILE).read_text()
    assert "non-stream serial (c=1)" in printed and f"report: {report}" in printed


@pytest.mark.parametrize("driver", ["raw", "aiohttp"])
def test_peers_rotation_takes_a_gateway_from_another_checkout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], driver: str
) -> None:
    sizes = ["--concurrency", "2", "--requests", "6", "--streams", "2", "--rounds", "1"]
    args = [*sizes, "--peers", "none", "--kvgate-from", f"other={CHECKOUT}", "--out", str(tmp_path)]
    assert main([*args, "--driver", driver]) == 0
    table = capsys.readouterr().out.split("router CPU per request")[1]
    for workload in ("non-stream", "back to back", "5 ms apart"):
        rows = [line.split() for line in table.splitlines() if workload in line]
        assert [row[-8] for row in rows] == ["kvgate", "other"]
        assert all(float(row[-4]) > 0 for row in rows), "requests per second"
        ttfc = [float(row[-2]) for row in rows]
        assert all(t > 0 for t in ttfc) if driver == "raw" else all(t != t for t in ttfc)


def test_peers_rotation_refuses_a_directory_that_holds_no_checkout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--out", str(tmp_path / "out")]
    assert main(["--peers", "none", "--kvgate-from", f"other={tmp_path}", *out]) == 2
    assert "DIR a kvgate checkout" in capsys.readouterr().err
    for taken in ("kvgate", "vllm:round_robin"):
        assert main(["--peers", "none", "--kvgate-from", f"{taken}={CHECKOUT}", *out]) == 2
        assert "already names a target" in capsys.readouterr().err
