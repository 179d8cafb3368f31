"""What the benchmarks' markdown reports share: when and on what machine a run was measured, tables,
and the hand-kept section a regenerated report keeps.

A report under ``docs/`` is rewritten by the benchmark that measured it. Figures no benchmark run
repeats (a profile read by hand, a comparison across commits) live in the same file under
``ONE_OFF_HEADING``, with the command that reproduces each; ``write_report`` carries that section
over from the file it replaces, so regenerating a report never loses them.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

ONE_OFF_HEADING = "## One-off measurements"


def run_date() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")


def machine() -> str:
    """Architecture, cores and Python of the machine measuring: a report's figures hold for it."""
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A markdown table's lines; a ``|`` inside a cell would end the cell, so it becomes ``/``."""

    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(str(cell).replace("|", "/") for cell in cells) + " |"

    return [line(header), "|" + "---|" * len(header), *(line(row) for row in rows)]


def write_report(path: Path, lines: list[str]) -> None:
    """Write ``lines`` to ``path``, followed by the one-off section of the file it replaces, if any."""
    kept: list[str] = []
    if path.exists():
        previous = path.read_text().splitlines()
        if ONE_OFF_HEADING in previous:
            kept = ["", *previous[previous.index(ONE_OFF_HEADING) :]]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([*lines, *kept]).rstrip("\n") + "\n")
