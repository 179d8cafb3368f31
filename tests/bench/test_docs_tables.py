"""Every table of numbers in ``docs/`` names the command that produced it (``tests/bench/docs_tables.py``
says how); a deterministic lab's table is checked against a rerun by ``make docs-check``, not here:
this runs no command and takes milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.docs_tables import DOCS, doc_tables, rerun, tables

UNMARKED_ALLOWED = {
    # Generated whole by `kvgate config reference`; tests/unit/test_config_reference.py is its rerun
    # check, and a marker here would make the file differ from what the schema renders.
    "config-reference.md",
}


def test_every_numeric_table_in_the_docs_names_where_its_numbers_come_from() -> None:
    unmarked = [
        f"{t.where} {t.rows[0][:60]}"
        for t in doc_tables()
        if t.numeric and t.marker is None and t.path.name not in UNMARKED_ALLOWED
    ]
    assert unmarked == [], "tables of numbers without a <!-- table: ... --> marker above them"


def test_every_marker_is_well_formed_and_sits_above_a_table() -> None:
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        above = {t.above.strip() for t in tables(text, path)}
        for number, line in enumerate(text.splitlines(), 1):
            if line.startswith("<!-- table:"):
                assert line.strip() in above, f"{path.name}:{number}: a marker with no table under it"
        for table in tables(text, path):
            if table.above.startswith("<!-- table:"):
                assert table.marker is not None, f"{table.where}: malformed marker {table.above!r}"


HEAD = "| trace | good % |\n|---|---|\n"


def doc(tmp_path: Path, marker: str, body: str) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "lab.md").write_text(f"# Lab\n\n{marker}\n| trace | good % |\n|---|---|\n{body}\n\nAfter.\n")
    return docs


@pytest.mark.parametrize(
    ("printed", "problems"),
    [
        ("| trace | good % |\n|---|---|\n| below | 99.9 |\n", 0),
        ("lab v1\n|trace|good %|\n|:--|--:|\n|below|99.9|\n", 0),  # padding and alignment aside
        ("| trace | good % |\n|---|---|\n| below | 100.0 |\n", 1),
        ("no table\n", 1),
        (f"{HEAD}| over | 1.0 |\n\nrun 2\n{HEAD}| below | 99.8 |\n", 1),
    ],
)
def test_docs_check_fails_when_a_rerun_prints_another_table(
    tmp_path: Path, printed: str, problems: int
) -> None:
    printer = tmp_path / "printed.txt"
    printer.write_text(printed)
    marker = f'<!-- table: command="cat {printer}" at="5d86b1b 2026-12-07" check="rerun" -->'
    docs = doc(tmp_path, marker, "| below | 99.9 |")
    assert len(rerun(docs, tmp_path)) == problems


def test_docs_check_reads_one_table_per_run_as_the_documents_one(tmp_path: Path) -> None:
    printer = tmp_path / "printed.txt"
    printer.write_text(f"run 1\n{HEAD}| below | 99.9 |\n\nrun 2\n{HEAD}| over | 71.0 |\n")
    marker = f'<!-- table: command="cat {printer}" at="5d86b1b 2026-12-07" check="rerun" -->'
    docs = doc(tmp_path, marker, "| below | 99.9 |\n| over | 71.0 |")
    assert rerun(docs, tmp_path) == []
    (docs / "lab.md").write_text((docs / "lab.md").read_text().replace("71.0", "70.9"))
    assert len(rerun(docs, tmp_path)) == 1


def test_docs_check_runs_no_measured_table(tmp_path: Path) -> None:
    marker = '<!-- table: command="false" at="5d86b1b 2026-12-07" check="measured" -->'
    assert rerun(doc(tmp_path, marker, "| below | 99.9 |"), tmp_path) == []
