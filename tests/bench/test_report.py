"""The benchmarks' markdown reports: tables, the one-off section a regenerated report keeps, and
the proxy report's parts."""

from pathlib import Path

from bench.harness.report import ONE_OFF_HEADING, table, write_report
from bench.proxy.report import ProxyFigures, ScenarioFigures, render


def test_a_pipe_in_a_cell_does_not_end_it() -> None:
    assert table(("a", "b"), [("x|y", 1)]) == ["| a | b |", "|---|---|", "| x/y | 1 |"]


def test_a_regenerated_report_keeps_the_one_off_section_of_the_file_it_replaces(tmp_path: Path) -> None:
    path = tmp_path / "docs" / "report.md"
    write_report(path, ["# Report", "", "old figures"])
    assert path.read_text() == "# Report\n\nold figures\n"
    one_off = [ONE_OFF_HEADING, "", "measured once: 42 µs (`python -m something`)"]
    path.write_text("\n".join(["# Report", "", "old figures", "", *one_off]) + "\n")
    write_report(path, ["# Report", "", "new figures"])
    assert path.read_text() == "\n".join(["# Report", "", "new figures", "", *one_off]) + "\n"


def test_the_proxy_report_shows_the_parts_measured_and_their_targets() -> None:
    figures = ProxyFigures(
        "python -m bench proxy --report r.md",
        64,
        [ScenarioFigures("non-stream", 4000, 0.181, 3.02, 30.5, 5100.0, 8000.0)],
        access_log_us={"kvgate, json": 6.9},
    )
    text = "\n".join(render(figures))
    assert "| non-stream | 4000 | 0.181 ms | ≤ 0.25 ms | 3.02 ms | 30.50 ms | 5100 | 8000 |" in text
    assert "| kvgate, json | 6.9 µs |" in text
    assert "## An access-log line" in text
    assert "## A request's spans" not in text and "## The decision path alone" not in text
    assert ONE_OFF_HEADING not in text
