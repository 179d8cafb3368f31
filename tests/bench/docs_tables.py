"""Every table of numbers in ``docs/`` says where its numbers come from, in a comment on the line
above it:

    <!-- table: command="python -m bench routing_lab --markdown" at="5d86b1b 2026-12-07" check="rerun" -->
    <!-- table: command="python -m bench proxy" at="5e70348 2026-12-02" check="measured" -->
    <!-- table: reference -->

``rerun``: a deterministic lab (simulated time, seeded) whose command prints the table again, row
for row; ``make docs-check`` (this module's ``main``) runs each such command once and fails when the
table it prints differs from the document's. ``measured``: a timed benchmark, which no rerun
reproduces, or a lab run against another commit's code (a before-and-after comparison) or too
long to repeat here (the autoscaling lab's 23 minutes); ``at`` is the commit and date it was
measured at. ``reference``: a table of names,
settings or behaviour, whose numbers are defaults or limits rather than results.

``tests/bench/test_docs_tables.py`` checks, fast, that every table with a digit in its rows has a
well-formed marker; it runs no command.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MARKER = re.compile(
    r'<!-- table: (?:reference|command="(?P<command>[^"]+)" at="(?P<commit>[0-9a-f]{7,40}) '
    r'(?P<date>\d{4}-\d{2}-\d{2})" check="(?P<check>rerun|measured)") -->'
)
_SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")
RERUN_TIMEOUT_S = 1800


@dataclass(frozen=True, slots=True)
class Table:
    path: Path
    line: int
    """1-based line of the table's header row."""
    rows: tuple[str, ...]
    """Header, separator and body rows, as written."""
    above: str
    """The line directly above the header (where the marker goes)."""

    @property
    def numeric(self) -> bool:
        return any(re.search(r"\d", row) for row in self.rows[2:])

    @property
    def marker(self) -> re.Match[str] | None:
        return MARKER.fullmatch(self.above.strip())

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path}:{self.line}"


def tables(text: str, path: Path = Path("-")) -> Iterator[Table]:
    """The markdown tables of ``text`` outside fenced code blocks."""
    lines = text.splitlines()
    fenced = False
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif (
            not fenced
            and line.startswith("|")
            and index + 1 < len(lines)
            and _SEPARATOR.match(lines[index + 1])
        ):
            end = index + 2
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            above = lines[index - 1] if index else ""
            yield Table(path, index + 1, tuple(lines[index:end]), above)
            index = end
            continue
        index += 1


def doc_tables(docs: Path = DOCS) -> Iterator[Table]:
    for path in sorted(docs.glob("*.md")):
        yield from tables(path.read_text(), path)


def cells(row: str) -> tuple[str, ...]:
    """A row's cells with their padding gone: ``| a |  b|`` and ``|a|b|`` are the same row."""
    return tuple(cell.strip() for cell in row.strip().strip("|").split("|"))


def same_table(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    return len(a) == len(b) and all(
        cells(x) == cells(y) or (_SEPARATOR.match(x) and _SEPARATOR.match(y))
        for x, y in zip(a, b, strict=True)
    )


def differences(table: Table, printed: str) -> str | None:
    """None when ``printed`` holds ``table`` (same header, same rows); else what it printed instead."""
    candidates = [t for t in tables(printed) if cells(t.rows[0]) == cells(table.rows[0])]
    if not candidates:
        return "the command printed no table with this header"
    # A command of several runs prints one table each; the document shows their rows as one.
    joined = (*candidates[0].rows[:2], *(row for t in candidates for row in t.rows[2:]))
    if same_table(joined, table.rows) or any(same_table(t.rows, table.rows) for t in candidates):
        return None
    return "the command printed instead:\n" + "\n".join(joined)


def rerun(docs: Path = DOCS, cwd: Path = ROOT) -> list[str]:
    """Run every ``check="rerun"`` command once (from ``cwd``, with this interpreter first on the
    PATH) and compare; returns one problem per differing table."""
    problems: list[str] = []
    printed: dict[str, str] = {}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    for table in doc_tables(docs):
        marker = table.marker
        if marker is None or marker["check"] != "rerun":
            continue
        command = marker["command"]
        if command not in printed:
            print(f"docs-check: {command}", file=sys.stderr)
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=RERUN_TIMEOUT_S,
                env=env,
                check=False,
            )
            if done.returncode != 0:
                problems.append(f"{table.where}: `{command}` exited {done.returncode}: {done.stderr[-2000:]}")
                printed[command] = ""
                continue
            printed[command] = done.stdout
        difference = differences(table, printed[command])
        if difference is not None:
            problems.append(f"{table.where}: the table differs from what `{command}` prints; {difference}")
    return problems


def main() -> int:
    problems = rerun()
    for problem in problems:
        print(problem, file=sys.stderr)
    checked = sum(1 for t in doc_tables() if t.marker is not None and t.marker["check"] == "rerun")
    print(f"docs-check: {checked} rerun table(s), {len(problems)} differing", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
