"""``python -m bench.bench_proxy --report``, cut to a few requests: backends and gateway as their
own processes, every part timed, the report written over an old one whose one-off section it keeps."""

from pathlib import Path

import pytest

from bench.bench_proxy import main
from bench.bench_report import ONE_OFF_HEADING


def test_report_measures_every_part_and_keeps_the_one_off_section(tmp_path: Path) -> None:
    report = tmp_path / "proxy-report.md"
    report.write_text(f"# Proxy benchmark\n\nstale figures\n\n{ONE_OFF_HEADING}\n\nkept: 42 µs\n")
    sizes = ["--concurrency", "4", "--requests", "16", "--only", "non-stream,serial"]
    parts = ["--decisions", "200", "--client", "200", "--access-log", "200", "--tracing", "50"]
    assert main([*sizes, *parts, "--report", str(report)]) == 0
    text = report.read_text()
    assert "stale figures" not in text
    assert text.endswith(f"{ONE_OFF_HEADING}\n\nkept: 42 µs\n")
    for row in ("| non-stream | 16 |", "| non-stream serial (c=1) | 2 |", "| 200 |", "| `ReplicaClient` |"):
        assert row in text
    for part in ("kvgate, json", "kvgate, text (logfmt) |", "sampled: four SDK spans |", "sampled out"):
        assert part in text


def test_peers_rotation_takes_a_gateway_from_another_checkout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkout = Path(__file__).resolve().parents[2]
    sizes = ["--concurrency", "2", "--requests", "6", "--streams", "2", "--rounds", "1"]
    assert main([*sizes, "--peers", "none", "--kvgate-from", f"other={checkout}"]) == 0
    table = capsys.readouterr().out.split("router CPU per request")[1]
    for workload in ("non-stream", "back to back", "5 ms apart"):
        rows = [line.split() for line in table.splitlines() if workload in line]
        assert [row[-4] for row in rows] == ["kvgate", "other"]


def test_peers_rotation_refuses_a_directory_that_holds_no_checkout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--peers", "none", "--kvgate-from", f"other={tmp_path}"]) == 2
    assert "DIR a kvgate checkout" in capsys.readouterr().err
    checkout = Path(__file__).resolve().parents[2]
    for taken in ("kvgate", "vllm:round_robin"):
        assert main(["--peers", "none", "--kvgate-from", f"{taken}={checkout}"]) == 2
        assert "already names a target" in capsys.readouterr().err
