"""What docs/architecture.md states about the code's shape, checked against the code.

The document's table of rooms is read here: every room it names exists and every package of
``kvgate/`` and ``bench/`` is one of them; the arrows it states for ``kvgate``'s rooms are the ones
``test_imports`` enforces, and those it states between benchmarks are the only imports from one
benchmark into another. Its limits hold: no module outside the tests over ``MODULE_LINE_LIMIT``
lines, no room over ``ROOM_SHARE_LIMIT`` of the lines outside the tests. And every benchmark the
catalog lists has a smoke test that runs its ``main``.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from bench.catalog import CATALOG
from tests.unit.test_imports import ALLOWED

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
MODULE_LINE_LIMIT = 450
ROOM_SHARE_LIMIT = 0.25
BENCH_SHARED = frozenset({"__init__", "__main__", "catalog"})
"""``bench``'s own modules: the catalog and ``python -m bench``, the room ``bench``."""


def room_of(path: Path) -> str:
    """``kvgate/gateway/edge/app.py`` -> ``kvgate.gateway``; ``bench/chaos/stage.py`` ->
    ``bench.chaos``; ``bench/routing.py`` -> ``bench.routing``; ``bench/catalog.py`` -> ``bench``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if len(parts) == 2:
        return parts[0] if parts[0] == "kvgate" or parts[1] in BENCH_SHARED else ".".join(parts)
    return f"{parts[0]}.{parts[1]}"


def sources() -> list[Path]:
    return sorted([*(ROOT / "kvgate").rglob("*.py"), *(ROOT / "bench").rglob("*.py")])


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines())


def documented_rooms() -> dict[str, frozenset[str]]:
    """The rooms table of docs/architecture.md: room -> the rooms it may import (``kvgate.*``:
    every room of ``kvgate`` but the root)."""
    text = DOC.read_text()
    section = text.split("## Rooms", 1)[1].split("\n## ", 1)[0]
    kvgate_rooms = [name for name in re.findall(r"^\| `(kvgate\.\w+)`", section, re.M)]
    rooms: dict[str, frozenset[str]] = {}
    for line in section.splitlines():
        match = re.match(r"\| `([\w.]+)` \|.*\| ([^|]*) \|$", line)
        if match is None:
            continue
        room, arrows = match.groups()
        names = set(re.findall(r"`([\w.*]+)`", arrows))
        if "kvgate.*" in names:
            names = names - {"kvgate.*"} | set(kvgate_rooms) - {room}
        rooms[room] = frozenset(names)
    return rooms


def bench_arrows(path: Path) -> set[str]:
    """The benchmarks (``bench.<name>`` rooms, the harness among them) that a module imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "bench":
                names = [f"bench.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "bench" and len(parts) > 1:
                found.add("bench" if parts[1] in BENCH_SHARED else f"bench.{parts[1]}")
    return found


def test_the_document_names_every_room_and_no_other() -> None:
    assert set(documented_rooms()) == {room_of(path) for path in sources()}


def test_the_arrows_it_states_for_kvgate_are_the_ones_the_import_test_enforces() -> None:
    documented = documented_rooms()
    assert {room: documented[room] for room in ALLOWED} == ALLOWED


def test_a_benchmark_imports_another_only_where_the_document_says_so() -> None:
    documented = documented_rooms()
    problems = [
        f"{path.relative_to(ROOT)} imports {sorted(bad)}"
        for path in sources()
        if (room := room_of(path)).startswith("bench")
        and (bad := bench_arrows(path) - {room} - documented[room])
    ]
    assert problems == []


def test_nothing_but_the_catalog_imports_a_benchmark() -> None:
    """Benchmarks are leaves: the harness and kvgate import none, the labs only the routing lab."""
    documented = documented_rooms()
    assert documented["bench.harness"] <= {room for room in documented if room.startswith("kvgate")}
    imported = {arrow for room, arrows in documented.items() if room != "bench" for arrow in arrows}
    assert {arrow for arrow in imported if arrow.startswith("bench.")} <= {
        "bench.harness",
        "bench.routing_lab",
        "bench.traces",
        "bench.tokenize",
    }


def test_no_module_outside_the_tests_exceeds_the_line_limit() -> None:
    over = {
        str(path.relative_to(ROOT)): lines
        for path in sources()
        if (lines := line_count(path)) > MODULE_LINE_LIMIT
    }
    assert not over, over


def test_no_room_holds_more_than_a_quarter_of_the_lines() -> None:
    lines: Counter[str] = Counter()
    for path in sources():
        lines[room_of(path)] += line_count(path)
    total = sum(lines.values())
    largest, largest_lines = lines.most_common(1)[0]
    assert largest_lines / total <= ROOM_SHARE_LIMIT, (largest, largest_lines, total)


def test_the_document_states_the_limits_checked_here() -> None:
    text = " ".join(DOC.read_text().split())
    assert f"{MODULE_LINE_LIMIT} lines" in text
    assert f"{ROOM_SHARE_LIMIT:.0%} of" in text.replace(" %", "%")


def test_every_benchmark_has_a_smoke_test_that_runs_its_main() -> None:
    tests = [path.read_text() for path in (ROOT / "tests" / "bench").glob("test_*.py")]
    missing = [
        benchmark.name
        for benchmark in CATALOG
        if not any(
            f"from {benchmark.module} import main" in text and re.search(r"\bmain\((\[|\w)", text)
            for text in tests
        )
    ]
    assert missing == []


def test_every_file_the_document_names_exists() -> None:
    named = set(re.findall(r"`((?:kvgate|bench|tests)/[\w/]+\.py)`", DOC.read_text()))
    assert named and [path for path in sorted(named) if not (ROOT / path).is_file()] == []
